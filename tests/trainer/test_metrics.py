"""A step's metrics from its batch: rewards, staleness, pace, calls per agent, the adapter's counts
under `adapter/`."""

from __future__ import annotations

import pytest

from adapters import AdapterSettings, build_batch
from tests.adapters.factory import call, rollout
from trainer.metrics import Pace, step_metrics


def test_a_steps_metrics_count_its_rollouts_calls_and_staleness() -> None:
    rollouts = [rollout("a", reward=1.0), rollout("b", reward=0.0)]
    calls = {
        "a": [call("a", 0, [1], [2, 3], version=3), call("a", 1, [1, 2, 3, 4], [5], version=4)],
        "b": [call("b", 0, [1], [6, 7, 8], agent="judge", version=2)],
    }
    settings = AdapterSettings(trained_agents=frozenset({"main"}))
    batch = build_batch(rollouts, calls, settings, version=4)
    m = step_metrics(rollouts, calls, batch, settings, base=4, version=5, elapsed=2.0)
    assert m["reward/mean"] == 0.5
    assert m["response_length/mean"] == 2.0
    assert m["rollout/calls_per_rollout"] == 1.5
    assert m["rollout/calls_per_s"] == 1.5
    assert (m["timing/step_s"], m["version"]) == (2.0, 5.0)
    # a's oldest call is one version behind, b's two
    assert (m["staleness/mean"], m["staleness/max"]) == (1.5, 2.0)
    assert m["staleness/count_1"] == m["staleness/count_2"] == 1.0
    assert m["calls/main/trained"] == 2.0 and m["calls/judge/untrained"] == 1.0
    assert m["adapter/calls_untrained"] == 1.0 and m["adapter/rollouts"] == 2.0
    assert m["rollout/sampled_entropy"] == pytest.approx(
        -float(batch.logprobs[batch.loss_mask].mean())
    )


def test_a_lap_is_the_time_since_the_last_one() -> None:
    pace = Pace()
    pace.last -= 5.0
    assert 5.0 <= pace.lap() < 6.0
    assert pace.lap() < 1.0
