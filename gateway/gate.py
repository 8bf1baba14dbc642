"""The pause gate: holds new calls while the gateway is paused, and tells when none is in flight.

- Owns: `enter`/`leave` around each call, `pause` (returns once the calls in flight have left),
  `resume`, and the maximum hold (`HeldTooLong` past it).
- Does not: know of model versions or replicas (`gateway/proxy.py` serves a version,
  `gateway/fleet.py` pauses every replica), nor answer HTTP (`gateway/errors.py` maps
  `HeldTooLong` to a status).
"""

import asyncio
import time


class HeldTooLong(Exception):
    """A call waited out the pause's maximum hold time."""


class Gate:
    """Pause/resume with drain: `enter`/`leave` around each call; `pause` waits for in-flight calls."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._drained = asyncio.Event()  # no call in flight
        self._open.set()
        self._drained.set()
        self.inflight = 0  # calls in flight
        self.waiting = 0  # calls held by a pause

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self, max_hold_s: float) -> None:
        if not self._open.is_set():
            self.waiting += 1
            try:
                await self._wait_open(max_hold_s)
            finally:
                self.waiting -= 1
        self.inflight += 1
        self._drained.clear()

    async def _wait_open(self, max_hold_s: float) -> None:
        """Waits until the gate is open when this call runs. A call woken by a resume runs later
        than the resume: if a pause closed the gate in between (replicas follow the store's pause
        and resume within one sync), it waits again, or it would be served during that pause."""
        deadline = time.monotonic() + max_hold_s
        while not self._open.is_set():
            left = deadline - time.monotonic()
            try:
                await asyncio.wait_for(self._open.wait(), max(left, 0))
            except TimeoutError as e:
                raise HeldTooLong(
                    f"the gateway has been paused for more than {max_hold_s:.0f} s"
                ) from e

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._drained.set()

    async def pause(self) -> None:
        self._open.clear()
        await self._drained.wait()

    def resume(self) -> None:
        self._open.set()
