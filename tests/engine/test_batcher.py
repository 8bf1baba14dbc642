"""The embedded engine's model loop (`engine/batcher.py`), called directly: what only a direct call
can check, such as a count taken at any moment."""

from __future__ import annotations

import time

import pytest

from engine.batcher import Engine, Job, Load, Sampling

pytestmark = pytest.mark.timeout(60)


def in_flight(jobs: list[Job]) -> list[Job]:
    return [job for job in jobs if not job.future.done()]


def test_a_request_in_flight_is_always_counted_running_or_waiting(engine: Engine) -> None:
    """`load` never reads 0 running and 0 waiting while a request is in flight (a trainer polls it
    for an idle engine): sampled without pause while requests are queued, prefilled (long prompts,
    so prefills take a while), decoded and answered; a request still in flight after a sample was
    in flight during it. Once all are answered, the counts go back to 0."""
    sampling = Sampling(max_new_tokens=4, temperature=0)
    jobs: list[Job] = []
    samples = 0
    busy = 0
    while len(jobs) < 24 or in_flight(jobs):
        if len(jobs) < 24 and samples % 50 == 0:
            prompt = [(7 * len(jobs) + i) % 500 + 1 for i in range(1500)]
            jobs.append(engine.submit(prompt, sampling))
        before = in_flight(jobs)
        now = engine.load()
        samples += 1
        if in_flight(before):
            assert now.running + now.waiting >= 1, (samples, now)
            busy += 1
    assert busy > 100 and all(job.future.result().finish for job in jobs)
    deadline = time.monotonic() + 5
    while engine.load() != Load(running=0, waiting=0, used_tokens=0, waiting_tokens=0):
        assert time.monotonic() < deadline, engine.load()
        time.sleep(0.01)
