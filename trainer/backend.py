"""The GPU backend: verl's Ray workers (FSDP actor) with sglang servers collocated on the same GPUs.

Wired from verl 0.9.1's own parts (DESIGN.md section 9), not its trainer: a worker group of
`ActorRolloutRefWorker` (our subclass only makes sure the `agl` loss is registered inside each
worker process), `LLMServerManager` for the hybrid-engine sglang replicas the gateway calls,
and `CheckpointEngineManager` for sleep (free weights and KV cache) and the in-memory weight
update that is also the wake-up. One step: old log-probs (`compute_log_prob`), then one
`update_actor` per mini-batch of whole rollouts, in verl's no-padding layout.

This module needs GPUs, Ray and sglang (`pip install .[train,gpu]`); it is exercised by
`bench/gpu_smoke.sh`, not by the CPU test suite.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ray
import torch
from omegaconf import DictConfig
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from verl.single_controller.ray.base import ResourcePoolManager, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from adapters import Batch
from trainer.config import AglConfig
from trainer.loss import set_old_log_probs, to_dataproto  # importing trainer.loss registers the `agl` loss

log = logging.getLogger(__name__)


class AglWorker(ActorRolloutRefWorker):
    """verl's worker; defined here so that unpickling it in a Ray worker imports (registers) our loss."""


class GpuBackend:
    """Actor and rollout on `trainer.n_gpus_per_node` x `trainer.nnodes` GPUs; sglang replicas for the gateway."""

    def __init__(self, cfg: DictConfig, agl: AglConfig) -> None:
        self.cfg, self.agl = cfg, agl
        if not ray.is_initialized():
            ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN"}})
        role = Role.ActorRolloutRef if cfg.actor_rollout_ref.actor.use_kl_loss else Role.ActorRollout
        pools = ResourcePoolManager(
            resource_pool_spec={"global_pool": [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes},
            mapping={role: "global_pool"},  # type: ignore[dict-item]
        )
        pools.create_resource_pool()
        pool = pools.get_resource_pool(role)
        worker = RayClassWithInitArgs(cls=ray.remote(AglWorker), config=cfg.actor_rollout_ref, role=str(role))
        group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict={str(role): worker}),
            device_name=cfg.trainer.device,
        )
        self.wg = group.spawn(prefix_set={str(role)})[str(role)]
        self.wg.init_model()
        self.dp_size = self.wg.world_size  # FSDP: every rank is a data-parallel rank
        self.servers = LLMServerManager.create(config=cfg, worker_group=self.wg, rollout_resource_pool=pool)
        engine_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
        engine_cfg.backend = "naive"  # collocated: weights move inside each GPU
        self.weights = CheckpointEngineManager(
            config=engine_cfg, actor_wg=self.wg, replicas=self.servers.get_replicas()
        )
        self.version = 0
        self.weights.sleep_replicas()
        self.weights.update_weights(0)  # the servers start with dummy weights
        log.info("sglang replicas for the gateway: %s", self.endpoints())

    def endpoints(self) -> list[str]:
        return [a if a.startswith("http") else f"http://{a}" for a in self.servers.get_addresses()]

    def sleep(self) -> None:
        self.weights.sleep_replicas()

    def push(self, path: Path | None, version: int) -> None:
        """Only remembered: in hybrid mode the weights move (in GPU memory) on `wake`."""
        self.version = version

    def wake(self) -> None:
        self.weights.update_weights(self.version)  # resume weights, push, flush cache, resume KV cache

    def update(self, batch: Batch) -> dict[str, float]:
        """Old log-probs for the batch, then one `update_actor` per mini-batch (verl's shapes, no padding)."""
        data = to_dataproto(batch, temperature=self.agl.temperature)
        td = left_right_2_no_padding(data.to_tensordict())
        tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
        out = self.wg.compute_log_prob(td)
        set_old_log_probs(data, no_padding_2_padding(tu.get(out, "log_probs"), td).float(), self.agl.is_cap)
        actor = self.cfg.actor_rollout_ref.actor
        metrics: dict[str, list[float]] = {}
        for m in range(int(data.batch["minibatch"].max()) + 1):
            rows = torch.nonzero(data.batch["minibatch"] == m).flatten()
            td = left_right_2_no_padding(data.select_idxs(rows).to_tensordict())
            tu.assign_non_tensor(
                td,
                calculate_entropy=False,
                distillation_use_topk=False,
                distillation_only=False,
                global_batch_size=len(rows),
                mini_batch_size=len(rows),  # one optimizer step per mini-batch of whole rollouts
                epochs=actor.ppo_epochs,
                seed=actor.data_loader_seed,
                dataloader_kwargs={"shuffle": False},  # samples are ordered by rank already
                compute_loss=True,
            )
            for k, v in tu.get(self.wg.update_actor(td), "metrics").items():
                metrics.setdefault(f"actor/{k}", []).extend(v if isinstance(v, list) else [v])
        return {k: float(sum(v) / len(v)) for k, v in metrics.items() if v}

    def save(self, path: Path) -> None:
        self.wg.save_checkpoint(str(path / "actor"), global_step=self.version)

    def load(self, path: Path) -> None:
        self.wg.load_checkpoint(str(path / "actor"))

    def close(self) -> None:
        ray.shutdown()
