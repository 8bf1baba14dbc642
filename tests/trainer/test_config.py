"""Hydra composition of verl's PPO trainer config with the `agl` section."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import LOSS, ConfigError, load_config, warmup_steps

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "calculator" / "train.yaml"


def test_the_demo_config_composes_with_verls_and_takes_overrides() -> None:
    cfg, agl = load_config(
        DEMO,
        [
            "agl.admin_key=k",
            "agl.n=8",
            "agl.max_staleness=null",
            "actor_rollout_ref.actor.clip_ratio=0.3",
        ],
    )
    assert agl.admin_key == "k" and agl.n == 8 and agl.max_staleness is None and agl.mode == "async"
    actor = cfg.actor_rollout_ref.actor
    # ours over verl's defaults
    assert actor.clip_ratio == 0.3 and actor.optim.lr == 1e-5 and actor.use_kl_loss
    assert actor.clip_ratio_c == 3.0 and "ppo_mini_batch_size" in actor  # verl's defaults are there
    assert actor.policy_loss.loss_mode == LOSS and actor.loss_agg_mode == "token-sum"
    assert cfg.trainer.total_training_steps == 12
    settings = agl.adapter(dp_size=2, minibatch_rollouts=3)
    assert settings.dp_size == 2 and settings.minibatch_rollouts == 3
    assert settings.loss_mode == "rollout" and settings.max_staleness is None
    # calls at other temperatures are not trained
    assert settings.temperature == agl.temperature == 0.7
    assert actor.optim.total_training_steps == 12  # the warm-up and schedule know the run's length


def test_warmup_steps_follow_verls_two_settings() -> None:
    cfg, _ = load_config(
        DEMO, ["agl.admin_key=k", "actor_rollout_ref.actor.optim.lr_warmup_steps=-1"]
    )
    assert warmup_steps(cfg.actor_rollout_ref.actor.optim) == 0  # verl's ratio default: 0.0
    overrides = [
        "actor_rollout_ref.actor.optim.lr_warmup_steps=-1",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.25",
    ]
    cfg, _ = load_config(DEMO, ["agl.admin_key=k", *overrides])
    assert warmup_steps(cfg.actor_rollout_ref.actor.optim) == 3  # 0.25 of 12 steps


def test_agl_fields_missing_from_the_file_can_be_set(tmp_path: Path) -> None:
    overrides = [
        "agl.seed=7",
        "agl.threads=1",
        "agl.advantage_level=sample",
        "agl.sample_mode=transition",
    ]
    overrides.append("agl.intermediate_coef=0.25")
    _, agl = load_config(
        DEMO, ["agl.admin_key=k", *overrides, "agl.trained_agents=[writer,checker]"]
    )
    assert agl.seed == 7 and agl.threads == 1
    settings = agl.adapter()  # each reaches the adapter
    assert settings.advantage_level == "sample" and settings.mode == "transition"
    assert settings.intermediate_coef == 0.25
    assert (
        settings.trained_agents == frozenset({"writer", "checker"})
        and load_config(DEMO, ["agl.admin_key=k"])[1].adapter().trained_agents is None
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "agl.admin_key"),  # ??? in the file: required
        (["agl.admin_key=k", "agl.n=0"], "agl.n"),
        (["agl.admin_key=k", "agl.mode=fast"], "agl.mode"),
        (["agl.admin_key=k", "agl.sample_mode=tree"], "agl.sample_mode"),
        (["agl.admin_key=k", "agl.trained_agents=writer"], "agl.trained_agents"),
        (["agl.admin_key=k", "agl.bogus=1"], "agl.bogus"),
        (["agl.admin_key=k", "agl.batch_groups=9", "agl.active_groups=4"], "active_groups"),
        (["agl.admin_key=k", "trainer.total_training_steps=null"], "total_training_steps"),
        (["agl.admin_key=k", "algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
        (["agl.admin_key=k", "actor_rollout_ref.actor.kl_loss_coef=0"], "kl_loss_coef"),
        (["agl.admin_key=k", "actor_rollout_ref.actor.kl_loss_type=k9"], "kl_loss_type"),
        (["agl.admin_key=k", "actor_rollout_ref.actor.entropy_coeff=-0.01"], "entropy_coeff"),
        (["agl.admin_key=k", "actor_rollout_ref.actor.ppo_epochs=0"], "ppo_epochs"),
        (
            ["agl.admin_key=k", "actor_rollout_ref.actor.ppo_mini_batch_size=0"],
            "ppo_mini_batch_size",
        ),
        (
            ["agl.admin_key=k", "actor_rollout_ref.actor.optim.lr_warmup_steps=16"],
            "lr_warmup_steps",
        ),
        # trainer.device cpu feeds the embedded engine
        (["agl.admin_key=k", "agl.engine="], "agl.engine"),
        (["agl.admin_key=k", "agl.guard_drop=0.2", "trainer.test_freq=0"], "agl.guard_drop"),
        (["agl.admin_key=k", "agl.guard_action=pray"], "agl.guard_action"),
        (["agl.admin_key=k", "agl.advantage_level=token"], "agl.advantage_level"),
        (
            ["agl.admin_key=k", "actor_rollout_ref.rollout.val_kwargs.do_sample=true"],
            "val_kwargs.temperature",
        ),
        (["agl.admin_key=k", "actor_rollout_ref.rollout.val_kwargs.n=0"], "val_kwargs.n"),
        (["agl.admin_key=k", "agl.temperature=0"], "agl.temperature"),
        (
            [
                "agl.admin_key=k",
                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                "agl.max_length=40000",
            ],
            "ppo_max_token_len_per_gpu",
        ),
    ],
)
def test_bad_configs_name_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(DEMO, overrides)


def test_a_config_without_verls_defaults_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bare.yaml"
    path.write_text("agl: {admin_key: k}\n")
    with pytest.raises(ConfigError, match="ppo_trainer"):
        load_config(path)


def test_the_gpu_example_trains_fp32_master_weights_at_the_harness_temperature() -> None:
    cfg, agl = load_config(ROOT / "examples" / "gpu" / "qwen3.5-9b-8gpu.yaml", ["agl.admin_key=k"])
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (
        actor.fsdp_config.model_dtype == "fp32"
        and actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    )
    assert agl.temperature == 0.7  # what examples/calculator/harness.py samples at
    # one setting, to sglang
    assert rollout.engine_kwargs.sglang.context_length == rollout.max_model_len == 32768
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
    assert agl.max_length <= actor.ppo_max_token_len_per_gpu
