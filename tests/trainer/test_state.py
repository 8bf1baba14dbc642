"""A checkpoint's `state.json`: `TrainerState` writes and reads the keys earlier checkpoints hold."""

from __future__ import annotations

import dataclasses
import json

from trainer.loop import Group, TrainerState


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
