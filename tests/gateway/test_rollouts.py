"""The gateway's per-rollout records: one per rollout, in a bounded map that drops the least
recently used first, and forgets a rollout on request."""

from gateway.rollouts import RolloutStates


def test_each_rollout_has_one_record_and_the_least_recently_used_goes_first() -> None:
    states = RolloutStates(since=0.0, size=2)
    a = states.of("a")
    a.sent_bytes = 10
    assert states.of("a") is a
    states.of("b")
    states.of("a")  # now "b" is the least recently used
    states.of("c")
    assert "a" in states and "c" in states and "b" not in states and len(states) == 2
    # A record was dropped for room: a rollout made before now may have lost its record.
    assert states.whole_since > 0.0


def test_a_forgotten_rollout_starts_a_new_record() -> None:
    states = RolloutStates(since=0.0)
    states.of("a").not_honoured.add("seed")
    states.forget("a")
    states.forget("never seen")
    assert "a" not in states and states.whole_since == 0.0  # forgetting is not dropping for room
    assert states.of("a").not_honoured == set()
