"""`agl train`'s configuration: verl's PPO trainer config (Hydra) plus an `agl` section.

A run's YAML lists verl's `ppo_trainer` in its `defaults` (as verl's own recipes do) and adds an
`agl:` block; command-line `key=value` overrides apply to both. verl's sections keep their
meaning: `actor_rollout_ref` (model, optimizer, clip ratios), `trainer.total_training_steps`,
`save_freq`, `test_freq`, `default_local_dir`, `logger`, `resume_mode`. This module composes
and validates; it starts nothing and imports no backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters import AdapterSettings

VERL_CONFIGS = "pkg://verl.trainer.config"
LOSS = "agl"  # our policy loss's name in verl's registry (trainer/loss.py)


class ConfigError(ValueError):
    """An unusable training config; the message names the field."""


class AglConfig(BaseModel):
    """The `agl:` section: where rollouts come from and how groups become batches."""

    model_config = ConfigDict(extra="forbid")
    gateway: str = Field("http://127.0.0.1:8000", description="Gateway URL (admin API).")
    admin_key: str = Field(min_length=1, description="The gateway's admin key.")
    engine: str = Field("", description="CPU backend: the embedded engine's URL (sleep, wake, weight push).")
    backend: Literal["cpu", "gpu"] = "cpu"
    mode: Literal["async", "sync"] = Field("async", description="async: collocated; sync: the baseline.")
    spec: dict[str, Any] | None = Field(
        None, description="The controller spec rollouts run (metadata.spec), unless a task entry carries its own."
    )
    tasks: str = Field(description="JSONL file of training tasks (one JSON object per line).")
    val_tasks: str = Field("", description="JSONL of validation tasks, run every trainer.test_freq steps.")
    n: int = Field(4, ge=1, description="Rollouts per task: one group.")
    batch_groups: int = Field(4, ge=1, description="Complete groups per training step.")
    active_groups: int = Field(8, ge=1, description="Async: groups kept running (>= batch_groups).")
    max_staleness: int | None = Field(1, ge=0, description="Drop rollouts more versions behind than this.")
    estimator: str = Field("grpo", description="grpo | rloo | reinforce_pp (adapters/advantage.py).")
    loss_mode: Literal["rollout", "token-mean", "seq-mean-token-mean"] = "rollout"
    is_cap: float = Field(2.0, gt=0, description="Truncated importance weight cap.")
    max_length: int = Field(32_768, ge=1, description="Longest merged sample (tokens).")
    micro_batch_tokens: int = Field(4096, ge=1, description="CPU backend: tokens per forward/backward.")
    threads: int = Field(0, ge=0, description="CPU backend: torch threads while training (0: every core).")
    temperature: float = Field(1.0, gt=0, description="The harnesses' sampling temperature (log-probs use it).")
    poll_s: float = Field(0.5, gt=0, description="How often rollout progress is read (seconds).")
    seed: int = 0

    def adapter(self, dp_size: int = 1, n_minibatches: int = 1) -> AdapterSettings:
        return AdapterSettings(
            max_length=self.max_length,
            estimator=self.estimator,
            loss_mode=self.loss_mode,
            max_staleness=self.max_staleness,
            is_cap=self.is_cap,
            dp_size=dp_size,
            n_minibatches=n_minibatches,
        )


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[DictConfig, AglConfig]:
    """Compose `path` (with verl's configs on the search path) and `overrides`; validate `agl`."""
    from hydra import compose, initialize_config_dir

    path = Path(path).resolve()
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    # `agl.*` fields may be left out of the file, so their overrides may add keys (`++`)
    overrides = [f"++{o}" if o.startswith("agl.") else o for o in overrides]
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        cfg = compose(path.stem, overrides=[*overrides, f"hydra.searchpath=[{VERL_CONFIGS}]"])
    if "agl" not in cfg or "actor_rollout_ref" not in cfg:
        raise ConfigError(f"{path}: needs an `agl:` section and `defaults: [ppo_trainer, _self_]`")
    try:
        agl = AglConfig.model_validate(OmegaConf.to_container(cfg.agl, resolve=True, throw_on_missing=True))
    except MissingMandatoryValue as e:
        raise ConfigError(f"{path}: {e.full_key} must be set") from e
    except ValidationError as e:
        problems = "; ".join(f"agl.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{path}: {problems}") from e
    if agl.mode == "async" and agl.active_groups < agl.batch_groups:
        raise ConfigError("agl.active_groups must be at least agl.batch_groups")
    if not cfg.trainer.total_training_steps:
        raise ConfigError("trainer.total_training_steps must be set")
    actor = cfg.actor_rollout_ref.actor
    with open_dict(actor):  # the loss that carries the adapter's weights, summed exactly (DESIGN.md 9)
        actor.policy_loss.loss_mode = LOSS
        actor.loss_agg_mode = "token-sum"
    return cfg, agl
