"""The pause gate: a pause returns once the calls in flight have left, holds new ones, and
gives up on a call held past its maximum hold."""

import asyncio

import pytest

from gateway.gate import Gate, HeldTooLong


def test_a_call_woken_by_a_resume_waits_again_if_a_pause_closed_the_gate_first():
    """Replicas follow the store's pause and resume: a resume and the next pause can come before a
    call the resume woke has run. That call must not be served during the new pause."""

    async def scenario() -> None:
        gate = Gate()
        await gate.pause()
        held = asyncio.create_task(gate.enter(5))
        await asyncio.sleep(0)  # it waits at the gate
        gate.resume()
        paused = asyncio.create_task(gate.pause())  # before the woken call runs
        await asyncio.sleep(0.05)
        assert paused.done() and not held.done() and gate.inflight == 0
        gate.resume()
        await held
        assert gate.inflight == 1

    asyncio.run(scenario())


def test_a_pause_waits_for_the_calls_in_flight_and_holds_new_ones():
    async def scenario() -> None:
        gate = Gate()
        await gate.enter(5)
        paused = asyncio.create_task(gate.pause())
        await asyncio.sleep(0.01)
        assert not paused.done() and gate.paused  # a call is in flight
        held = asyncio.create_task(gate.enter(5))
        await asyncio.sleep(0.01)
        assert gate.waiting == 1 and not held.done()
        gate.leave()
        await paused  # drained
        assert not held.done()
        gate.resume()
        await held
        assert gate.inflight == 1 and gate.waiting == 0 and not gate.paused

    asyncio.run(scenario())


def test_a_call_held_past_the_maximum_hold_is_refused():
    async def scenario() -> None:
        gate = Gate()
        await gate.pause()
        with pytest.raises(HeldTooLong):
            await gate.enter(0.05)
        assert gate.waiting == 0 and gate.inflight == 0

    asyncio.run(scenario())
