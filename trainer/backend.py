"""The backend: verl's Ray workers (FSDP actor and reference) train the model; engines serve it.

Wired from verl 0.9.1's parts, not its trainer: `AglWorker`s in verl's no-padding layout, stepped
by `Backend.update` with our loss (`trainer/loss.py`). The device changes only where rollouts are
served (`trainer/engines.py`): `cuda` collocates verl's sglang replicas; `cpu` runs the same workers
on verl's `cpu` platform (`trainer/cpu_platform.py`), saving weights for the embedded engine: the
demo and CI run the GPU code. The weights saved (`export`) are a Hugging Face folder of the
checkpoint's own class and dtype; this module does not choose how engines load them.
"""

import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from verl.single_controller.ray.base import RayResourcePool, create_colocated_worker_cls
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from adapters import Batch
from trainer import cpu_platform, fsdp_guard
from trainer.config import AglConfig, ConfigError
from trainer.engines import Collocated, DiskEngine
from trainer.loss import agl_ppo_loss, to_dataproto  # importing trainer.loss registers `agl`

log = logging.getLogger(__name__)


class ExportError(RuntimeError):
    """The actor's weights do not fit the checkpoint's own model class (an export would lose
    some)."""


class AglWorker(ActorRolloutRefWorker):
    """verl's worker, and: defined here so that unpickling it in a Ray worker registers our loss;
    our loss function; role `actor_ref` (actor and reference without a rollout engine, which
    verl's roles lack); a gloo process group on the CPU (verl would ask for `cpu:gloo,cpu:gloo`);
    FSDP2's guard for modules that sit out the forward pass (`trainer/fsdp_guard.py`);
    `save_weights` for disk-loading engines."""

    def __init__(self, config: DictConfig, role: str, **kwargs: Any) -> None:
        verl_role = role
        if role == "actor_ref":  # not one of verl's roles: it starts as an "actor"
            verl_role = "actor"
        super().__init__(config, verl_role, **kwargs)
        # init_model builds what the role names: "actor_ref" holds "actor" and "ref"
        self.role = role
        fsdp_guard.install()
        if cpu_platform.active() and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("gloo", rank=self.rank, world_size=self.world_size)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[attr-defined]
    def init_model(self) -> None:
        """verl's models for the role, the actor's loss function ours."""
        super().init_model()
        assert self.actor is not None
        self.actor.set_loss_fn(partial(agl_ppo_loss, omega_conf_to_dataclass(self.config.actor)))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[attr-defined]
    def save_weights(self, path: str) -> None:
        """The actor's full weights as a Hugging Face folder at `path`, of the checkpoint's own
        class and dtype: every rank takes part in each tensor's gather, rank 0 alone keeps the
        tensors and writes them."""
        from transformers import AutoConfig

        assert self.actor is not None
        model_config = self.actor.model_config
        config = AutoConfig.from_pretrained(
            str(model_config.local_hf_config_path),
            trust_remote_code=model_config.trust_remote_code,
        )
        params, _ = self.actor.engine.get_per_tensor_param()
        state = gather(params, keep=self.rank == 0, dtype=checkpoint_dtype(config))
        if self.rank == 0:
            export(
                state,
                config,
                Path(path),
                generation_config=model_config.generation_config,
                trust_remote_code=model_config.trust_remote_code,
            )


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype a checkpoint's config.json names (`dtype`, or `torch_dtype` before transformers
    5), at its top level or in its text model's config (composite models such as Qwen3.5); None
    if it names none."""
    for part in (config, config.get_text_config()):
        dtype = getattr(part, "dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if isinstance(dtype, torch.dtype):
            return dtype
    return None


def gather(
    params: Iterable[tuple[str, torch.Tensor]], *, keep: bool, dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """verl's full tensors (`get_per_tensor_param`), walked to the end on every rank, since each
    one's `full_tensor()` is a collective that every rank joins. With `keep` (rank 0) each lands on
    the CPU, its floating-point ones in `dtype` (unless None); without, each is dropped at once
    and the answer is empty."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in params:
        if not keep:
            continue
        if dtype is not None and tensor.is_floating_point():
            state[name] = tensor.detach().to("cpu", dtype)
        else:
            state[name] = tensor.detach().to("cpu")
    return state


def export(
    state: dict[str, torch.Tensor],
    config: Any,
    path: Path,
    *,
    generation_config: Any = None,
    trust_remote_code: bool = False,
) -> None:
    """`state` (checkpoint key names, as verl's `convert_weight_keys` gives them) saved at `path`
    as the model class verl trains for `config` (`get_hf_auto_model_class`: the image-text class
    for Qwen3.5, whose causal-LM class is text-only and would lose keys). The model is built on the
    meta device and takes `state`'s tensors as they are (their dtype is the export's), so no base
    weights are read. Raises `ExportError` unless the keys match the class's exactly."""
    from verl.utils.model import get_hf_auto_model_class

    dtype = next(t.dtype for t in state.values() if t.is_floating_point())
    with torch.device("meta"):
        model = get_hf_auto_model_class(config).from_config(
            config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    loaded = model.load_state_dict(state, strict=False, assign=True)
    if loaded.missing_keys or loaded.unexpected_keys:
        raise ExportError(
            f"the actor's weights do not fit {type(model).__name__}: "
            f"{len(loaded.missing_keys)} missing (such as {loaded.missing_keys[:3]}), "
            f"{len(loaded.unexpected_keys)} unexpected (such as {loaded.unexpected_keys[:3]})"
        )
    # `assign` gave tied weights (embeddings and output head) a tensor each: one again
    model.tie_weights()
    if generation_config is not None:
        model.generation_config = generation_config
    # non-persistent buffers (rotary `inv_freq`) stay on the meta device: save_pretrained never
    # writes them, and loading the folder computes them again
    model.save_pretrained(path)


def _log_probs(call: Any, data: Any) -> torch.Tensor:
    """A worker-group log-prob call on the batch `data` (a DataProto), padded back to verl's
    (rows, response) shape."""
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    return no_padding_2_padding(tu.get(call(td), "log_probs"), td).float()


class Backend:
    """Actor (and reference) on `trainer.n_gpus_per_node` x `trainer.nnodes` devices, and the
    engines they feed."""

    def __init__(self, cfg: DictConfig, agl: AglConfig) -> None:
        self.agl = agl
        self.actor = cfg.actor_rollout_ref.actor
        on_cpu = cfg.trainer.device == "cpu"
        env: dict[str, str] = {}
        if on_cpu:
            env = dict(cpu_platform.ENV)
        os.environ.update(env)  # this process asks verl's platform too (resource pools)
        if on_cpu:  # Ray gives each worker one thread; the engine sleeps while they train
            env["OMP_NUM_THREADS"] = str(agl.threads or os.cpu_count() or 1)
        # Ray's default niceness, 15, starves the trainer on a busy host
        os.environ.setdefault("RAY_worker_niceness", "0")
        if not ray.is_initialized():
            env_vars = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", **env}
            # the dashboard costs CPU
            ray.init(include_dashboard=False, runtime_env={"env_vars": env_vars})
        role = _role(on_cpu=on_cpu, kl=bool(self.actor.use_kl_loss))
        nodes = [int(cfg.trainer.n_gpus_per_node)] * int(cfg.trainer.nnodes)
        kind = "CPU" if on_cpu else "GPU"
        have = ray.cluster_resources().get(kind, 0)
        if have < sum(nodes):  # verl would wait for them forever
            ray.shutdown()
            raise ConfigError(
                f"trainer.n_gpus_per_node x trainer.nnodes asks for {sum(nodes)} ranks, "
                f"but Ray has {have:g} {kind}s"
            )
        pool = RayResourcePool(
            process_on_nodes=nodes, use_gpu=not on_cpu, max_colocate_count=1, name_prefix="agl"
        )
        worker = RayClassWithInitArgs(
            cls=ray.remote(AglWorker), config=cfg.actor_rollout_ref, role=role
        )
        group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict={role: worker}),
            device_name=cfg.trainer.device,
        )
        self.wg = group.spawn(prefix_set={role})[role]
        self.wg.init_model()
        self.dp_size = self.wg.world_size  # FSDP: every rank is a data-parallel rank
        weights = Path(cfg.trainer.default_local_dir) / "weights"
        self.engine: DiskEngine | Collocated
        if on_cpu:
            self.engine = DiskEngine(
                agl.engine, weights, lambda p: self.wg.save_weights(str(p)), idle_s=agl.idle_s
            )
        else:
            self.engine = Collocated(cfg, self.wg, pool, idle_s=agl.idle_s)
        log.info("engines for the gateway: %s", self.engine.endpoints())

    def update(self, batch: Batch) -> dict[str, float]:
        """Reference and old log-probs for the batch, one `update_actor` per mini-batch, then the
        step's KL."""
        started = time.monotonic()
        data = to_dataproto(batch, temperature=self.agl.temperature)
        if self.actor.use_kl_loss:
            data.batch["ref_log_prob"] = _log_probs(self.wg.compute_ref_log_prob, data)
        minibatches = int(data.batch["minibatch"].max()) + 1
        # else the policy before the step is the one updating
        if minibatches > 1 or self.actor.ppo_epochs > 1:
            data.batch["old_log_probs"] = _log_probs(self.wg.compute_log_prob, data)
        metrics: dict[str, list[float]] = defaultdict(list)
        for m in range(minibatches):
            rows = torch.nonzero(data.batch["minibatch"] == m).flatten()
            td = left_right_2_no_padding(data.select_idxs(rows).to_tensordict())
            # the other keys verl's update reads keep their defaults: no shuffle, no distillation
            tu.assign_non_tensor(
                td,
                calculate_entropy=True,
                mini_batch_size=len(rows),  # one optimizer step per mini-batch of whole rollouts
                epochs=self.actor.ppo_epochs,
                is_cap=self.agl.is_cap,
            )
            for k, v in tu.get(self.wg.update_actor(td), "metrics").items():
                name = k
                if "/" not in k:
                    name = f"actor/{k}"
                if isinstance(v, list):
                    metrics[name].extend(v)
                else:
                    metrics[name].append(v)
        out = {k: float(sum(v) / len(v)) for k, v in metrics.items() if v}
        # one per mini-batch and epoch
        out["actor/optimizer_steps"] = len(metrics["actor/grad_norm"])
        trained = data.batch["response_mask"].bool()
        # k3 estimate of KL(behaviour || updated policy) on the batch's sampled tokens
        updated = _log_probs(self.wg.compute_log_prob, data)
        log_ratio = (updated - data.batch["rollout_log_probs"])[trained].clamp(-20, 20)
        out["actor/kl_k3"] = float((log_ratio.exp() - 1 - log_ratio).mean())
        out["timing/update_s"] = time.monotonic() - started
        return out

    def save(self, path: Path) -> None:
        """verl's checkpoint (`path/actor`: model, optimizer, schedule) and the weights engines
        load (`path/model`)."""
        self.wg.save_checkpoint(str(path / "actor"), global_step=0)
        self.wg.save_weights(str(path / "model"))

    def load(self, path: Path) -> None:
        """verl's checkpoint at `path/actor` into the actor (model, optimizer, schedule)."""
        self.wg.load_checkpoint(str(path / "actor"))

    def close(self) -> None:
        """The engines' clients closed and Ray shut down."""
        self.engine.close()
        ray.shutdown()


def _role(*, on_cpu: bool, kl: bool) -> str:
    """verl's worker role: with the reference model when the loss has a KL term; with verl's
    rollout engines (sglang) on GPUs, without them on the CPU (the embedded engine serves)."""
    if on_cpu:
        if kl:
            return "actor_ref"
        return "actor"
    if kl:
        return "actor_rollout_ref"
    return "actor_rollout"
