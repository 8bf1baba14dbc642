"""What the gateway keeps of each rollout between its calls: one record per rollout, one lifetime.

Owns `RolloutState` (the replay check after a restart, the bytes sent against the storage budget,
the request fields named in `not_honoured` events, the transcripts prompts are built on) and
`RolloutStates`, the bounded map that holds them: a record is made on a rollout's first request,
dropped when the rollout ends or goes back to the queue (`forget`), and the least recently used
goes first past `MAX_ROLLOUTS`, so a long-running gateway does not grow with every rollout it has
served. Everything in a record can be rebuilt: dropping one costs a store read or a re-render. It
does not decide what the fields mean (`gateway/proxy.py`) nor build transcripts (`gateway/render.py`).
"""

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from agl.types import Call
from gateway.render import Transcript

MAX_ROLLOUTS = 10_000  # records kept; the least recently used is dropped first


@dataclass
class RolloutState:
    """The gateway's state of one rollout (of its current attempt), kept between its calls."""

    # Whether a call of it was already checked for a retry of a reply cut off by a restart.
    replay_checked: bool = False
    # Bytes of request bodies its tokens have sent, against its storage budget; None until read
    # (the store's figure for a rollout older than the record).
    sent_bytes: int | None = None
    # The seq of its last call another replica recorded that `Proxy._catch_up` made a transcript.
    caught_up: int = -1
    # With replicas, its latest call this gateway holds whole (it recorded it, or read it to catch
    # up): a read of a later call's chain stops there, and a call recorded after a catch-up is
    # stored as the extension of the call read. Its request too: about as much memory as one of
    # the transcripts below.
    last_call: Call | None = None
    # The request fields its `not_honoured` events have named.
    not_honoured: set[str] = field(default_factory=set)
    # Its latest conversations' token sequences (`Renderer.prompt` builds on them). Replaced, never
    # changed in place: a prompt rendered on another thread reads a list that stays as it was.
    transcripts: list[Transcript] = field(default_factory=list)


class RolloutStates:
    """Rollout id -> its `RolloutState`, the least recently used dropped past `size`."""

    def __init__(self, *, since: float, size: int = MAX_ROLLOUTS) -> None:
        """`since`: when the gateway started (wall-clock time, s)."""
        self.size = size
        self._states: OrderedDict[str, RolloutState] = OrderedDict()
        # Since when no record was dropped for room (the gateway's start, then each drop's time):
        # a rollout made since has had its record from its first request on.
        self.whole_since = since

    def of(self, rollout_id: str) -> RolloutState:
        """The rollout's record, made on its first request; now the most recently used."""
        state = self._states.get(rollout_id)
        if state is None:
            state = RolloutState()
            self._states[rollout_id] = state
            self._make_room()
        else:
            self._states.move_to_end(rollout_id)
        return state

    def forget(self, rollout_id: str) -> None:
        """The rollout ended or went back to the queue: its next request starts a new record."""
        self._states.pop(rollout_id, None)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._states

    def _make_room(self) -> None:
        while len(self._states) > self.size:
            self._states.popitem(last=False)
            self.whole_since = time.time()
