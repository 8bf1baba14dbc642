"""Hydra composition of verl's PPO trainer config with the `agl` section."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import LOSS, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "calculator" / "train.yaml"


def test_the_demo_config_composes_with_verls_and_takes_overrides() -> None:
    cfg, agl = load_config(
        DEMO, ["agl.admin_key=k", "agl.n=8", "agl.max_staleness=null", "actor_rollout_ref.actor.clip_ratio=0.3"]
    )
    assert agl.admin_key == "k" and agl.n == 8 and agl.max_staleness is None and agl.mode == "async"
    actor = cfg.actor_rollout_ref.actor
    assert actor.clip_ratio == 0.3 and actor.optim.lr == 5e-5  # ours over verl's default
    assert actor.clip_ratio_c == 3.0 and "ppo_mini_batch_size" in actor  # verl's defaults are there
    assert actor.policy_loss.loss_mode == LOSS and actor.loss_agg_mode == "token-sum"
    assert cfg.trainer.total_training_steps == 12
    settings = agl.adapter(dp_size=2)
    assert settings.dp_size == 2 and settings.loss_mode == "rollout" and settings.max_staleness is None


def test_agl_fields_missing_from_the_file_can_be_set(tmp_path: Path) -> None:
    _, agl = load_config(DEMO, ["agl.admin_key=k", "agl.seed=7", "agl.threads=1"])
    assert agl.seed == 7 and agl.threads == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "agl.admin_key"),  # ??? in the file: required
        (["agl.admin_key=k", "agl.n=0"], "agl.n"),
        (["agl.admin_key=k", "agl.mode=fast"], "agl.mode"),
        (["agl.admin_key=k", "agl.bogus=1"], "agl.bogus"),
        (["agl.admin_key=k", "agl.batch_groups=9", "agl.active_groups=4"], "active_groups"),
        (["agl.admin_key=k", "trainer.total_training_steps=null"], "total_training_steps"),
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
