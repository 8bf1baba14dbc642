"""verl's `cpu` platform, so that the GPU backend's update path (verl's FSDP2 workers) runs on the
CPU.

verl 0.9.1 registers only accelerator platforms. This one maps verl's device calls onto the CPU:
gloo for collectives, no-op memory, stream and profiler calls, Ray's `CPU` resource. `ENV` loads it
in every verl process (`trainer.backend.Backend` sets it for `trainer.device: cpu`; verl keys its
engines by `cuda`/`npu` only, hence `VERL_ENGINE_DEVICE=cuda`). The CPU becomes a test bed for the
GPU code path, not a fast trainer. The platform is available only when `VERL_PLATFORM=cpu` asks for
it: verl's auto-detection never falls back to it.
"""

import contextlib
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda", "VERL_USE_EXTERNAL_MODULES": __name__}


def active() -> bool:
    """Whether this process asks for the CPU platform (`VERL_PLATFORM=cpu`)."""
    return os.environ.get("VERL_PLATFORM") == "cpu"


if active() and not torch.cuda.is_available():
    # verl's FSDP2 reference model always takes CPUOffloadPolicy(pin_memory=True); there is no
    # accelerator to pin memory for, and the tensors already live on the CPU
    torch.Tensor.pin_memory = lambda self, *_, **__: self  # type: ignore[method-assign]


def _returns(value: Any) -> Callable[..., Any]:
    """A device call that takes any arguments and answers `value`."""
    return lambda *_, **__: value


_nothing = _returns(None)


# torch.<device> as verl 0.9.1 calls it (`get_torch_device()`): torch.cpu's device-agnostic calls
# (its streams, events and synchronize do nothing), torch's RNG state (checkpoints), and no-ops for
# the memory calls the CPU has not.
DEVICE = SimpleNamespace(
    **{name: getattr(torch.cpu, name) for name in torch.cpu.__all__},
    get_device_name=_returns("cpu"),
    mem_get_info=_returns((0, 0)),
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    **dict.fromkeys(
        ["memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"],
        _returns(0),
    ),
    **dict.fromkeys(["empty_cache", "ipc_collect"], _nothing),
    **dict.fromkeys(["set_per_process_memory_fraction", "reset_peak_memory_stats"], _nothing),
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform for the CPU: its device calls answered by `DEVICE` and no-ops."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = DEVICE  # type: ignore[assignment]
    set_device = _nothing
    synchronize = _nothing
    set_allocator_settings = _nothing
    empty_cache = _nothing
    profiler_start = _nothing
    profiler_stop = _nothing
    cudart = _nothing
    nvtx_range = contextlib.nullcontext  # type: ignore[assignment]

    def is_available(self) -> bool:
        """Only when asked for (`active`): verl's auto-detection takes the first available
        platform, and a CPU that always answered would train on the CPU whenever the CUDA probe
        failed."""
        return active()

    # verl moves tensors `.to(get_device_id())`: the CPU, not an accelerator index
    current_device = _returns("cpu")
    device_count = _returns(1)
    get_device_capability = _returns((None, None))
    communication_backend_name = _returns("gloo")
    visible_devices_envvar = _returns("AGL_CPU_VISIBLE_DEVICES")
    ray_resource_name = _returns("CPU")
    ray_noset_envvars = _returns([])
    is_ipc_supported = _returns(False)

    def manual_seed(self, seed: int) -> None:
        """Seed torch's generator, the CPU's only one."""
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        """A worker's Ray resources: its devices are CPUs."""
        return {"num_cpus": num_gpus}
