"""This gateway among its replicas: its registration, its heartbeat, and the pause that holds them all.

Gateway replicas share one store (PostgreSQL; SQLite serves one process) and nothing else: a load
balancer that knows nothing of rollouts sends any call to any of them. What they must agree on is
kept in the store's `fleet` row: whether new calls are held, the pause's number (`epoch`), and the
model version served. Each replica follows that row and counts its live peers (it reads both
every `SYNC_S`; a gateway alone on a SQLite store has none to follow), and registers itself with a
heartbeat (every `HEARTBEAT_S`) that says which pause it last drained for.

A pause, sent to any replica, marks the fleet paused and returns once every live replica has
drained: its calls in flight finished, each under the version it started with. A replica that
starts while the fleet is paused starts paused. A replica whose heartbeat is older than `TTL_S`
(dead, or stalled that long) no longer counts, so it cannot hold a pause for ever. Two pauses at
once share one epoch, and both return once it has drained.

It does not hold calls itself (`gateway/gate.py`'s `Gate` does, per process), nor serve HTTP.
"""

import asyncio
import contextlib
import logging
import os
import socket
import time
from asyncio import wrap_future
from collections.abc import Awaitable, Callable
from dataclasses import replace

from agl.store import Store
from agl.types import Fleet, Gateway
from gateway.proxy import Proxy
from gateway.types import Peers

log = logging.getLogger(__name__)

SYNC_S = 0.1  # how often a replica reads the fleet's row (s): a pause reaches it within this
HEARTBEAT_S = 1.0  # how often it writes its heartbeat (s)
TTL_S = 10.0  # a replica whose heartbeat is older than this no longer counts (s)


class Replicas:
    """Keeps this gateway registered and its gate following the fleet's pause and version."""

    def __init__(self, store: Store, proxy: Proxy, peers: Peers, address: str) -> None:
        """`peers`: the proxy's count of the other live gateways, kept here."""
        self.store = store
        self.proxy = proxy
        self.peers = peers
        now = time.time()
        self.me = Gateway(
            id=proxy.id,
            address=f"{socket.gethostname()} {address}",
            pid=os.getpid(),
            started_at=now,
            heartbeat_at=now,
        )
        self.drained_epoch = 0  # the latest pause this gateway drained for
        self.serial = -1  # the fleet state's serial this gateway follows
        self.problem = ""  # why the store could not be reached, while it cannot
        self._following = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    async def join(self) -> None:
        """Registers this gateway, follows the fleet's state, and starts the heartbeat and sync."""
        registered = self.store.register_gateway(self.me, expired_before=time.time() - TTL_S)
        await self._follow(await wrap_future(registered))  # started paused, if the fleet is
        await self._sync()
        self._tasks = [asyncio.create_task(self._every(HEARTBEAT_S, self._beat))]
        # Only another gateway joins, or changes the fleet's row behind this one's back: a store
        # that serves one gateway process (SQLite) has none to follow. There the sync was three
        # quarters of an idle gateway's CPU (12 of 16 ms a second).
        if not self.store.single_process:
            self._tasks.append(asyncio.create_task(self._every(SYNC_S, self._sync)))

    async def leave(self) -> None:
        """Stops following and deregisters: a pause no longer waits for this gateway."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await wrap_future(self.store.deregister_gateway(self.me.id))

    async def pause(self) -> float:
        """Holds new calls on every replica; returns once every live one has drained (the seconds
        that took)."""
        started = time.monotonic()
        state = await wrap_future(self.store.pause_fleet())
        await self._follow(state)
        while True:
            alive = await asyncio.to_thread(self.store.gateways, alive_since=time.time() - TTL_S)
            if all(g.drained_epoch >= state.epoch for g in alive):
                return time.monotonic() - started
            await asyncio.sleep(SYNC_S)

    async def resume(self, version: int | None) -> None:
        """Serves the held calls on every replica, under `version` from now on if given. This
        one resumes at once, the others within `SYNC_S`."""
        state = await wrap_future(self.store.resume_fleet(version))
        await self._follow(state)

    def state(self) -> dict[str, object]:
        """This gateway's id and whether the store answers (`/healthz`)."""
        return {"gateway": self.me.id, "store": self.problem or "ok"}

    async def _follow(self, state: Fleet) -> None:
        """Brings this gateway's gate and version to the fleet's `state`."""
        async with self._following:
            if state.serial < self.serial:
                return  # read before one already followed (a sync racing a pause or resume)
            self.serial = state.serial
            if state.version is not None:
                self.proxy.serve_version(state.version)
            if state.paused and self.drained_epoch < state.epoch:
                await self.proxy.pause()
                self.drained_epoch = state.epoch
                await self._beat()  # a pause waiting on this gateway learns at once
            elif not state.paused and self.proxy.gate.paused:
                self.proxy.resume()

    async def _beat(self) -> None:
        beat = replace(self.me, heartbeat_at=time.time(), drained_epoch=self.drained_epoch)
        await wrap_future(self.store.heartbeat(beat))

    async def _sync(self) -> None:
        """Follows the fleet's state, and counts the other live gateways: a replica that joins is
        known to the others within `SYNC_S`, before long its first call. One read."""
        alive_since = time.time() - TTL_S
        read = self.store.fleet_and_peers
        state, peers = await asyncio.to_thread(read, self.me.id, alive_since=alive_since)
        await self._follow(state)
        self.peers.count = peers

    async def _every(self, period_s: float, step: Callable[[], Awaitable[None]]) -> None:
        """Runs `step` every `period_s`; a store that cannot be reached is reported, not fatal."""
        while True:
            try:
                await step()
                self.problem = ""
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - reported on /healthz, retried
                if not self.problem:
                    log.warning("the store cannot be reached: %s", e)
                self.problem = f"the store cannot be reached: {e}"[:500]
            await asyncio.sleep(period_s)
