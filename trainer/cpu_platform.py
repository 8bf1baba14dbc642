"""verl's `cpu` platform, so that the GPU backend's update path (verl's FSDP2 workers) runs on the CPU.

verl 0.9.1 registers only accelerator platforms. This one maps verl's device calls onto the
CPU: gloo for collectives, no-op memory, stream and profiler calls, Ray's `CPU` resource. It is
loaded in every verl process through `VERL_USE_EXTERNAL_MODULES=trainer.cpu_platform` with
`VERL_PLATFORM=cpu` (`trainer.backend.Backend` sets both when `trainer.device` is `cpu`); verl's engines
are registered under device keys `cuda`/`npu` only, hence `VERL_ENGINE_DEVICE=cuda`. It makes
the CPU a test bed for the GPU code path (DESIGN.md section 9), not a fast trainer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", "VERL_USE_EXTERNAL_MODULES": __name__}


def active() -> bool:
    """Whether this process runs verl on this platform."""
    return os.environ.get("VERL_PLATFORM") == "cpu"


if active() and not torch.cuda.is_available():
    # verl's FSDP2 reference model always takes CPUOffloadPolicy(pin_memory=True); there is no
    # accelerator to pin memory for, and the tensors already live on the CPU
    torch.Tensor.pin_memory = lambda self, *_, **__: self  # type: ignore[method-assign]


def _nothing(*_: Any, **__: Any) -> None:
    return None


class _Stream:
    """What verl asks of a device stream: to be waited on and entered."""

    def __init__(self, *_: Any, **__: Any) -> None: ...

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *_: Any) -> None: ...

    wait_stream = synchronize = record_event = wait_event = _nothing


# torch.<device> as verl uses it: the calls the CPU has (torch.cpu) and no-ops for the memory,
# stream and RNG calls it has not.
DEVICE = SimpleNamespace(
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: "cpu",
    set_device=_nothing,
    synchronize=_nothing,
    empty_cache=_nothing,
    ipc_collect=_nothing,
    set_per_process_memory_fraction=_nothing,
    mem_get_info=lambda *_: (0, 0),
    memory_allocated=lambda *_: 0,
    memory_reserved=lambda *_: 0,
    max_memory_allocated=lambda *_: 0,
    max_memory_reserved=lambda *_: 0,
    reset_peak_memory_stats=_nothing,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_device_name=lambda *_: "cpu",
    Stream=_Stream,
    Event=_Stream,
    stream=lambda *_: _Stream(),
    current_stream=lambda *_: _Stream(),
    amp=torch.amp,
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return DEVICE  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return "cpu"  # verl moves tensors `.to(get_device_id())`: the CPU's device, not an accelerator index

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None: ...

    def synchronize(self, device_index: int | None = None) -> None: ...

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None: ...

    def empty_cache(self) -> None: ...

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "AGL_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None: ...

    def profiler_stop(self) -> None: ...

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
