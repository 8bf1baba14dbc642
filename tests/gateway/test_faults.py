"""The gateway under faults and load, as real processes: `agl gateway` over a SQLite store,
SIGKILLed and restarted under load, paused and resumed on new weights under load, and in front
of an engine that fails. The engine is the instant stand-in of bench/gateway.py (a fake: no GPU
engine runs here, and what is under test is the gateway, not sampling). The phases are
bench/soak.py's, at sizes a test can afford; `make soak` runs them larger."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from bench import soak
from bench.stack import Stack, running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(tmp_path_factory.mktemp("faults")) as stack:
        yield stack


def test_gateway_sigkill_under_load_loses_no_answered_call(procs: Stack) -> None:
    """200 rollouts calling; the gateway is SIGKILLed under load and restarted on the same store.
    Harnesses retry refused and cut connections with the same request (as SDKs do). Every
    answered call is recorded once; a call committed just before the kill, whose reply never
    left, is answered from the store when retried, not sampled and recorded a second time."""
    out = asyncio.run(soak.gateway_kill(procs, rollouts=200, calls=2, kills=1))
    assert out["answered"] == 400 and out["errors"] == 0
    assert out["retries"] > 0  # the kill did land under load
    assert (
        out["lost"] == 0
        and out["duplicated"] == 0
        and out["orphaned"] == 0
        and out["seq_gaps"] == 0
    )
    assert out["recorded"] == 400


def test_pause_resume_cycles_under_load(procs: Stack) -> None:
    """Pause/resume cycles, each onto new engine weights, while harnesses call with no retries: no
    harness sees an error, and each call is recorded under the weights that sampled it. (Each
    pause drains every call in flight, so a cycle costs about harnesses / calls-per-second; the
    soak runs 100 cycles under 200 harnesses.)"""
    out = asyncio.run(soak.pause_cycles(procs, harnesses=50, cycles=30, per_cycle=10))
    assert out["errors"] == 0, out["first_errors"]
    assert out["crossed_version"] == 0
    assert out["lost"] == 0 and out["orphaned"] == 0 and out["duplicated"] == 0
    assert out["answered"] >= 30 * 10


def test_a_failing_engine_gives_clear_errors_and_the_gateway_stays_healthy(
    procs: Stack,
) -> None:
    out = asyncio.run(soak.engine_faults(procs, slow=False))
    assert out["5xx_retried"] == 200  # two 5xx, then an answer: within the gateway's 3 attempts
    for fault in ("5xx_persistent", "stopped"):
        status, text = out[fault]
        # no address
        assert status == 503 and "unavailable" in text and "127.0.0.1" not in text, (fault, text)
    # the details are in the gateway's log
    assert "after 3 attempts" in (procs.tmp / "gateway.log").read_text()
    assert out["healthz_failed"] == 0 and out["back"] == 200
