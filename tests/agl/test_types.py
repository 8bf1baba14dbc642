"""The rules `agl.types` holds for every component: here, which rollouts count (are trained on)."""

from __future__ import annotations

import pytest

from agl.types import FailureKind, Mode, Rollout, Status


def a_rollout(status: Status, failure_kind: FailureKind | None) -> Rollout:
    return Rollout(
        id="r", task={}, group="g", mode=Mode.TRAIN, status=status, failure_kind=failure_kind
    )


@pytest.mark.parametrize(
    ("status", "failure_kind", "counts"),
    [
        (Status.SUCCEEDED, None, True),
        (Status.FAILED, FailureKind.TASK, True),
        (Status.TIMED_OUT, FailureKind.TASK, True),
        (Status.FAILED, FailureKind.INFRA, False),
        (Status.CANCELLED, None, False),
        (Status.RUNNING, None, False),
        (Status.QUEUED, FailureKind.INFRA, False),
    ],
)
def test_only_an_ended_rollout_with_the_policys_own_outcome_counts(
    status: Status, failure_kind: FailureKind | None, counts: bool
) -> None:
    assert a_rollout(status, failure_kind).counts is counts
