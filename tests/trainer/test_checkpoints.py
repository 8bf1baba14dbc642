"""A run's checkpoints: `state.json` holds the keys earlier checkpoints hold; `latest` and keep-N."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from trainer.checkpoints import Checkpoints, Group, TrainerState


def a_state() -> TrainerState:
    return TrainerState(
        step=3,
        version=2,
        cursor=5,
        history=[{"reward/mean": 0.5, "version": 1.0}, {"val/reward_mean": 0.25}],
        trained=[["run/0"], ["run/1", "run/2"]],
        best=0.25,
        groups=[Group(id="run/3", rollouts=["r1", "r2"], version=2)],
    )


def test_state_json_is_byte_for_byte_what_the_trainer_wrote_before() -> None:
    state = a_state()
    # the trainer's checkpointed attributes by name, in this order, groups as their fields
    earlier = {
        "step": state.step,
        "version": state.version,
        "cursor": state.cursor,
        "history": state.history,
        "trained": state.trained,
        "best": state.best,
        "groups": state.groups,
    }
    assert state.to_json() == json.dumps(earlier, default=dataclasses.asdict)


def test_a_saved_state_restores_with_its_groups() -> None:
    restored = TrainerState.from_json(a_state().to_json())
    assert restored == a_state()
    assert isinstance(restored.groups[0], Group)


def test_keys_a_state_json_lacks_keep_their_defaults_and_unknown_ones_are_ignored() -> None:
    restored = TrainerState.from_json(json.dumps({"step": 2, "version": 2, "extra": 1}))
    assert restored == TrainerState(step=2, version=2)


class Weights:
    """The backend's part in a checkpoint: it writes a model folder."""

    def save(self, path: Path) -> None:
        (path / "model").mkdir()
        (path / "model" / "weights").write_text("w")


def test_a_checkpoint_is_named_latest_and_only_the_newest_are_kept(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path, Weights(), keep=2)
    assert checkpoints.latest() is None
    for step in (1, 2, 10):
        saved = checkpoints.save(TrainerState(step=step, version=step))
    assert saved == tmp_path / "step_10" == checkpoints.latest()
    assert (saved / "model" / "weights").read_text() == "w"
    assert Checkpoints.state(saved) == TrainerState(step=10, version=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_10", "step_2"]


def test_a_named_checkpoint_leaves_latest_and_the_step_folders_alone(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path, Weights(), keep=1)  # at least 2 are kept
    for step in (1, 2):
        checkpoints.save(TrainerState(step=step))
    best = checkpoints.save(TrainerState(step=3, best=0.5), "best")
    assert best == checkpoints.path("best")
    assert Checkpoints.state(best).best == 0.5
    assert checkpoints.latest() == tmp_path / "step_2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "latest", "step_1", "step_2"]
