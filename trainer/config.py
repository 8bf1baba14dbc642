"""`agl train`'s configuration: verl's PPO trainer config (Hydra) plus an `agl` section.

A run's YAML lists verl's `ppo_trainer` in its `defaults` (as verl's recipes do) and adds an
`agl:` block; `key=value` overrides apply to both. verl's sections keep their meaning:
`actor_rollout_ref` (model, optimizer, clip ratios), `trainer.total_training_steps`, `save_freq`,
`test_freq`, `default_local_dir`, `logger`, `resume_mode`. This module composes and validates; it
starts nothing and imports no backend.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, MissingMandatoryValue, OmegaConf, open_dict
from pydantic import Field, ValidationError

from adapters import AdapterSettings
from agl.settings import Strict, problems

LOSS = "agl"  # our policy loss's name in verl's registry (trainer/loss.py)
VERL_CONFIGS = "hydra.searchpath=[pkg://verl.trainer.config]"  # where `ppo_trainer` is found


class ConfigError(ValueError):
    """An unusable training config; the message names the field."""


class AglConfig(Strict):
    """The `agl:` section: where rollouts come from and how groups become batches."""

    gateway: str = Field("http://127.0.0.1:8000", description="Gateway URL (admin API).")
    admin_key: str = Field(min_length=1, description="The gateway's admin key.")
    engine: str = Field(
        "", description="trainer.device cpu: the embedded engine's URL (sleep, wake, weight push)."
    )
    mode: Literal["async", "sync"] = Field(
        "async", description="async: collocated; sync: the baseline."
    )
    spec: dict[str, Any] | None = Field(
        None, description="Controller spec for rollouts; a task may carry its own."
    )
    tasks: str = Field(description="JSONL file of training tasks (one JSON object per line).")
    val_tasks: str = Field(
        "", description="JSONL of validation tasks, run every trainer.test_freq steps."
    )
    n: int = Field(4, ge=1, description="Rollouts per task: one group.")
    batch_groups: int = Field(4, ge=1, description="Complete groups per training step.")
    active_groups: int = Field(8, ge=1, description="Async: groups kept running (>= batch_groups).")
    max_staleness: int | None = Field(
        1, ge=0, description="Drop rollouts more versions behind than this."
    )
    estimator: str = Field(
        "grpo", description="grpo | rloo | reinforce_pp (adapters/advantage.py)."
    )
    advantage_level: Literal["rollout", "sample"] = Field(
        "rollout", description="Group members: rollouts or samples."
    )
    loss_mode: Literal["rollout", "token-mean", "seq-mean-token-mean"] = "rollout"
    is_cap: float = Field(2.0, gt=0, description="Truncated importance weight cap.")
    max_length: int = Field(32_768, ge=1, description="Longest merged sample (tokens).")
    sample_mode: Literal["trajectory", "transition"] = Field(
        "trajectory", description="Merge calls, or one per call."
    )
    trained_agents: list[str] | None = Field(
        None, description="Agents whose calls are trained; default: every one."
    )
    intermediate_coef: float = Field(
        0.0, description="Per-call rewards' weight in their call's advantage (0: off)."
    )
    threads: int = Field(
        0, ge=0, description="trainer.device cpu: torch threads of each worker (0: every core)."
    )
    temperature: float = Field(
        1.0, gt=0, description="The harnesses' sampling temperature; other calls: untrained."
    )
    guard_drop: float | None = Field(
        None, gt=0, description="Act when validation falls this far below its best."
    )
    guard_action: Literal["stop", "restore"] = Field(
        "stop", description="stop, or restore the best-validated weights."
    )
    poll_s: float = Field(0.5, gt=0, description="How often rollout progress is read (seconds).")
    idle_s: float = Field(
        30.0,
        gt=0,
        description="Before sleep or a weight push: how long an engine may take to end its "
        "requests (seconds).",
    )
    seed: int = 0

    def adapter(self, dp_size: int = 1, minibatch_rollouts: int | None = None) -> AdapterSettings:
        """The adapter's settings: the fields they share, verl's data-parallel size and
        `ppo_mini_batch_size`."""
        shared = {
            "max_length",
            "estimator",
            "advantage_level",
            "loss_mode",
            "max_staleness",
            "temperature",
            "intermediate_coef",
            "trained_agents",  # a list here, a frozenset there
        }
        return AdapterSettings(
            **self.model_dump(include=shared),
            dp_size=dp_size,
            minibatch_rollouts=minibatch_rollouts,
            mode=self.sample_mode,
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
        cfg = compose(path.stem, overrides=[*overrides, VERL_CONFIGS])
    if "agl" not in cfg or "actor_rollout_ref" not in cfg:
        raise ConfigError(f"{path}: needs an `agl:` section and `defaults: [ppo_trainer, _self_]`")
    try:
        section = OmegaConf.to_container(cfg.agl, resolve=True, throw_on_missing=True)
        agl = AglConfig.model_validate(section)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{path}: {e.full_key} must be set") from e
    except ValidationError as e:
        raise ConfigError(f"{path}: {problems(e, 'agl.')}") from e
    if agl.mode == "async" and agl.active_groups < agl.batch_groups:
        raise ConfigError("agl.active_groups must be at least agl.batch_groups")
    if not cfg.trainer.total_training_steps:
        raise ConfigError("trainer.total_training_steps must be set")
    actor = cfg.actor_rollout_ref.actor
    # the loss that carries the adapter's weights, summed exactly (docs/architecture.md,
    # "Building on verl")
    with open_dict(actor):
        actor.policy_loss.loss_mode = LOSS
        actor.loss_agg_mode = "token-sum"
        # the schedule's length, as verl sets it
        actor.optim.total_training_steps = cfg.trainer.total_training_steps
    _check_training(cfg, agl)
    return cfg, agl


ACTOR = "actor_rollout_ref.actor"  # where the actor's settings are, in error messages
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k2+", "k3+", "low_var_kl+")


def warmup_steps(optim: DictConfig) -> int:
    """verl's warm-up length: `lr_warmup_steps`, or when not positive `lr_warmup_steps_ratio` of
    the steps."""
    steps = int(optim.get("lr_warmup_steps", -1))
    if steps > 0:
        return steps
    return int(optim.get("lr_warmup_steps_ratio", 0.0) * optim.total_training_steps)


def _check_training(cfg: DictConfig, agl: AglConfig) -> None:
    """Refuse settings that would mis-train silently, naming the field."""
    _check_actor(cfg)
    _check_validation(cfg, agl)
    actor = cfg.actor_rollout_ref.actor
    if cfg.trainer.device == "cpu" and not agl.engine:
        raise ConfigError(
            "trainer.device cpu trains for the embedded engine: set agl.engine to its URL"
        )
    if actor.use_dynamic_bsz and agl.max_length > actor.ppo_max_token_len_per_gpu:
        raise ConfigError(
            f"agl.max_length ({agl.max_length}) exceeds {ACTOR}.ppo_max_token_len_per_gpu "
            f"({actor.ppo_max_token_len_per_gpu}): a sample that long cannot be placed"
        )


def _check_actor(cfg: DictConfig) -> None:
    """The actor's loss terms, epochs, mini-batches and warm-up."""
    actor = cfg.actor_rollout_ref.actor
    a = ACTOR
    if cfg.get("algorithm", {}).get("use_kl_in_reward"):
        raise ConfigError(
            "algorithm.use_kl_in_reward is not supported (harnesses give rewards); "
            f"use {a}.use_kl_loss"
        )
    if actor.use_kl_loss and not actor.kl_loss_coef > 0:
        raise ConfigError(f"{a}.use_kl_loss needs {a}.kl_loss_coef > 0, got {actor.kl_loss_coef}")
    if actor.use_kl_loss and actor.kl_loss_type not in KL_TYPES:
        raise ConfigError(
            f"{a}.kl_loss_type must be one of {', '.join(KL_TYPES)}, got {actor.kl_loss_type!r}"
        )
    if actor.entropy_coeff < 0:
        raise ConfigError(f"{a}.entropy_coeff must be >= 0 (a bonus), got {actor.entropy_coeff}")
    for key in ("ppo_epochs", "ppo_mini_batch_size"):  # the latter counts rollouts (agl's adapter)
        if int(actor[key]) < 1:
            raise ConfigError(f"{a}.{key} must be at least 1")
    if warmup_steps(actor.optim) >= cfg.trainer.total_training_steps:
        raise ConfigError(f"{a}.optim.lr_warmup_steps must be below trainer.total_training_steps")


def _check_validation(cfg: DictConfig, agl: AglConfig) -> None:
    """The guard and the validation rounds' sampling."""
    validated = agl.val_tasks and (cfg.trainer.test_freq > 0 or cfg.trainer.get("val_before_train"))
    if agl.guard_drop is not None and not (agl.val_tasks and cfg.trainer.test_freq > 0):
        raise ConfigError(
            "agl.guard_drop needs validation: agl.val_tasks and trainer.test_freq > 0"
        )
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    if validated and val.do_sample and not val.temperature > 0:
        raise ConfigError(
            "actor_rollout_ref.rollout.val_kwargs.temperature must be > 0 with do_sample "
            "(else greedy)"
        )
    if validated and int(val.n) < 1:
        raise ConfigError("actor_rollout_ref.rollout.val_kwargs.n must be at least 1")
