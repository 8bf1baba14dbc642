"""The proxy's state of a rollout between calls: one record (`gateway/rollouts.py`), forgotten
when the rollout ends or goes back to the queue; a rollout whose record may have been dropped
for room counts its storage budget from what the store holds. Real store (SQLite); no call is
sampled, so there is no engine or renderer."""

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl.store import Store
from agl.types import Charge, Status
from gateway.engines import Room
from gateway.proxy import Proxy
from gateway.rollouts import RolloutStates
from gateway.settings import GatewaySettings
from gateway.types import Peers


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'proxy.db'}") as store:
        yield store


def proxy_on(store: Store) -> Proxy:
    unused: Any = None  # the engines and the renderer: no call is sampled
    room = Room(context_length=2048)
    return Proxy(
        store,
        unused,
        unused,
        GatewaySettings(),
        room=room,
        honours_seed=True,
        parse_request=unused,  # no call of another gateway is caught up on
        peers=Peers(),
    )


def test_a_rollout_s_state_is_forgotten_when_it_ends_or_goes_back_to_the_queue(store: Store):
    proxy = proxy_on(store)
    rollout = store.create_rollout({"q": 1}, "g").result().rollout
    expected = {
        Status.RUNNING: True,
        Status.QUEUED: False,  # retried: the next attempt starts afresh
        Status.SUCCEEDED: False,
        Status.FAILED: False,
        Status.TIMED_OUT: False,
        Status.CANCELLED: False,
    }
    for status, kept in expected.items():
        proxy.rollouts.of(rollout.id).replay_checked = True
        proxy.moved(dataclasses.replace(rollout, status=status))
        assert (rollout.id in proxy.rollouts) is kept, status


def test_a_rollout_whose_record_was_dropped_counts_its_budget_from_the_store(store: Store):
    """A first attempt made since the gateway started has sent nothing before its record; once a
    record was dropped for room, a new record starts from what the store holds."""
    proxy = proxy_on(store)
    proxy.rollouts = RolloutStates(since=proxy.started, size=1)
    made = store.create_rollout({"q": 1}, "g").result().rollout
    charge = Charge(size=1200, budget=10_000)
    store.append_event(made.id, "step", {"note": "x" * 1000}, charge=charge).result()
    asyncio.run(proxy.charge(made, 10))
    assert proxy.rollouts.of(made.id).sent_bytes == 10  # the store was not read
    other = store.create_rollout({"q": 2}, "g").result().rollout
    asyncio.run(proxy.charge(other, 10))
    assert made.id not in proxy.rollouts
    asyncio.run(proxy.charge(made, 10))
    sent = proxy.rollouts.of(made.id).sent_bytes
    assert sent == store.sent_bytes(made.id) + 10 and sent > 1000


def test_a_rollout_made_since_a_gateway_alone_on_sqlite_started_is_not_read_for_a_replay(
    store: Store,
):
    """A retry of a reply cut off by a crash is looked for on a rollout's first call here, among
    calls another gateway recorded. On SQLite, which serves one gateway process, a rollout made
    since this gateway started has none: its first call reads nothing. One made before (the
    gateway restarted) is read."""
    older = store.create_rollout({"q": 1}, "g").result().rollout
    proxy = proxy_on(store)
    newer = store.create_rollout({"q": 2}, "g").result().rollout
    reads: list[str] = []
    last_calls = store.last_calls

    def counting(rollout_id: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(rollout_id)
        return last_calls(rollout_id, *args, **kwargs)

    store.last_calls = counting  # type: ignore[method-assign]
    for rollout in (older, newer):
        asyncio.run(proxy._recent(rollout, proxy.rollouts.of(rollout.id), 1))
    assert reads == [older.id]
