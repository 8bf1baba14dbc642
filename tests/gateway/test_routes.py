"""Who may post what on a rollout's own routes, each decision one rule over every role: which
events (`may_post`) and which status changes (`may_move`)."""

import pytest

from agl.types import Mode, Rollout, Status
from gateway.auth import Caller, Role
from gateway.routes import may_move, may_post

PLAIN = Rollout(id="p", task={}, group="g", mode=Mode.TRAIN, status=Status.RUNNING)
GRADED = Rollout(
    id="g", task={}, group="g", mode=Mode.TRAIN, status=Status.RUNNING, has_grader=True
)


@pytest.mark.parametrize(
    ("role", "rollout", "kind", "allowed"),
    [
        (Role.ADMIN, GRADED, "lifecycle", True),
        (Role.ADMIN, GRADED, "flag", True),
        (Role.AGENT, PLAIN, "step", True),
        (Role.AGENT, PLAIN, "flag", True),  # no grader: the agent's own
        (Role.AGENT, PLAIN, "lifecycle", False),
        (Role.AGENT, GRADED, "step", True),
        (Role.AGENT, GRADED, "flag", False),  # it steers the reward: the grader's
        (Role.AGENT, GRADED, "swe_patch", False),
        (Role.AGENT, GRADED, "reward", False),
        (Role.GRADER, GRADED, "flag", True),
        (Role.GRADER, GRADED, "swe_patch", True),
        (Role.GRADER, GRADED, "not_honoured", False),
    ],
)
def test_who_may_post_which_event(role: Role, rollout: Rollout, kind: str, allowed: bool) -> None:
    assert may_post(Caller(role=role, rollout=rollout), rollout, kind) is allowed


def test_a_token_may_start_and_end_its_rollout_but_only_the_admin_retry_or_cancel_it() -> None:
    starts_or_ends = {Status.RUNNING, Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT}
    for status in Status:
        assert may_move(Caller(role=Role.ADMIN), status), status
        for role in (Role.AGENT, Role.GRADER):
            allowed = status in starts_or_ends
            assert may_move(Caller(role=role, rollout=PLAIN), status) is allowed, (role, status)
