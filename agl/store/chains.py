"""A rollout's calls stored as chains: each the extension of its agent's previous call.

A call whose agent called before in the same attempt (and this writer remembers it) is stored as
its extension: `base` = {"seq": that call's seq, "prompt_from": k, "same": [keys], "from": {key:
n}}. The prompt is the first k IDs of that call's prompt and response, then its own `prompt_ids`;
a request key in `same` (stored as null) has that call's value; one in `from`, a list, that call's
first n items, then its own. So a rollout's stored bytes grow with its new tokens.

- Owns the `base` layout, the writer's memory of each agent's last call (`Chains`), turning a call
  into its stored extension (`chain`) and rows back into whole calls (`calls_of`), and the query
  that reads calls through their chains back to one stored whole (`chain_rows`).
- Does not open transactions or write rows: `writes.py` inserts what `chain` returns, and the
  writer thread (`writer.py`) commits it and calls `Chains.commit`.
"""

import hashlib
import pickle
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from agl.store.errors import StoreError
from agl.store.schema import calls
from agl.types import ARRAYS, JSON, Call, Rollout, Status

# Rollouts whose last calls the writer keeps to chain the next (about 4 bytes per token each).
MAX_CHAINS = 4096
# A call row's `base` seq: the call it extends (NULL: stored whole).
BASE_SEQ = calls.c.base["seq"].as_integer()


def chain_rows(anchor: sa.Select[Any]) -> sa.Select[Any]:
    """The rows of the calls `anchor` selects (`seq`, and `BASE_SEQ` as `base`, of the rollout
    bound as `rollout_id`) and of the calls each extends, back to one stored whole or to call
    `known` (a bound seq: a call the reader holds whole, whose row is not read unless `anchor`
    selects it, and whose chain is not), in seq order: one query, whatever the chain's length."""
    chain = anchor.cte("chain", recursive=True)
    chain = chain.union(
        sa.select(calls.c.seq, BASE_SEQ).where(
            calls.c.rollout_id == sa.bindparam("rollout_id"),
            calls.c.seq == chain.c.base,
            calls.c.seq != sa.bindparam("known"),
            chain.c.seq != sa.bindparam("known"),
        )
    )
    rollout = calls.c.rollout_id == sa.bindparam("rollout_id")
    return (
        sa.select(calls)
        .join(chain, sa.and_(rollout, calls.c.seq == chain.c.seq))
        .order_by(calls.c.seq)
    )


@dataclass(frozen=True)
class _Read:
    """What `calls_of` keeps of a call read, to rebuild a later one that extends it."""

    ids: np.ndarray  # prompt + response
    request: JSON
    agent: str


def calls_of(rows: Iterable[Any], known: Call | None = None) -> Iterator[Call]:
    """Whole calls from their rows, in (rollout, seq) order: each chained one after the call it
    extends. That is an earlier call of its agent, most often the last: a call recorded by one
    gateway replica extends the last call that replica recorded or read (`Chains.follow`).
    `known`: a call the caller holds whole, which a row may extend without the call's own row
    being read (if read, it is not decoded)."""
    read: dict[int, _Read] = {}  # seq -> the call, of the rollout being read
    rollout_id = None
    for row in rows:
        if row.rollout_id != rollout_id:
            rollout_id = row.rollout_id
            read = {}
            if known is not None and known.rollout_id == rollout_id:
                read[known.seq] = _Read(ids=_ids(known), request=known.request, agent=known.agent)
        if known is not None and (row.rollout_id, row.seq) == (known.rollout_id, known.seq):
            yield known
            continue
        values = dict(row._mapping)
        base = values.pop("base")
        values.pop("request_hash")  # not part of a call
        found = _decode_arrays(values)
        if base is not None:
            previous = read.get(base["seq"])
            if previous is None or previous.agent != values["agent"]:
                raise StoreError(
                    f"call {values['seq']} of rollout {rollout_id} extends call {base['seq']}, "
                    "not read"
                )
            kept = previous.ids[: base["prompt_from"]]
            found["prompt_ids"] = np.concatenate([kept, found["prompt_ids"]])
            values["request"] = _unchain(values["request"], previous.request, base)
        read[values["seq"]] = _Read(
            ids=np.concatenate([found["prompt_ids"], found["response_ids"]]),
            request=values["request"],
            agent=values["agent"],
        )
        arrays = {name: array(ARRAYS[name], a.tobytes()) for name, a in found.items()}
        yield Call(**values | arrays)


def _ids(call: Call) -> np.ndarray:
    """A call's prompt and response IDs, in one array."""
    return np.concatenate([np.asarray(call.prompt_ids, "i"), np.asarray(call.response_ids, "i")])


def _decode_arrays(values: JSON) -> dict[str, np.ndarray]:
    """A row's token arrays (little-endian bytes) in the host's byte order."""
    try:
        return {
            name: np.frombuffer(values[name], "<" + code).astype(code)
            for name, code in ARRAYS.items()
        }
    except ValueError as e:
        raise StoreError(f"corrupt token array: {e}") from e


def _fingerprint(value: Any) -> bytes:
    """Equal only for equal values: a pickle is exact (in JSON text NaN can read as null) and 3x
    quicker to make; it is never loaded."""
    return hashlib.blake2b(pickle.dumps(value, protocol=5), digest_size=16).digest()


@dataclass(frozen=True)
class _Link:
    """What the writer keeps of an agent's last call: its IDs and its request's fingerprints (key ->
    value's, or for a list each item's), not the request itself: a long conversation's request is
    megabytes of objects."""

    attempt: int
    seq: int
    ids: np.ndarray  # prompt + response
    keys: dict[str, Any]


class Chains:
    """The writer thread's links: `committed` (its calls are stored) and `pending` (in the open
    transaction)."""

    def __init__(self, size: int) -> None:
        self.size = size
        # rollout -> agent -> link, the least recently used rollout first
        self.committed: OrderedDict[str, dict[str, _Link]] = OrderedDict()
        self.pending: dict[tuple[str, str], _Link] = {}

    def get(self, rollout_id: str, agent: str) -> _Link | None:
        """The agent's last call in the rollout: in the open transaction, else committed."""
        pending = self.pending.get((rollout_id, agent))
        if pending is not None:
            return pending
        return self.committed.get(rollout_id, {}).get(agent)

    def follow(self, call: Call) -> None:
        """The agent's next call extends `call`, a stored call read whole (another gateway
        replica recorded it), unless the link kept is of the same call or a later one. So a call
        that changed replica extends the call it continues, and a replica that reads it back
        finds, one link away, the call it recorded itself (`Store.last_calls`'s `known`)."""
        link = self.get(call.rollout_id, call.agent)
        if link is not None and (link.attempt, link.seq) >= (call.attempt, call.seq):
            return
        self.pending[call.rollout_id, call.agent] = _Link(
            attempt=call.attempt, seq=call.seq, ids=_ids(call), keys=request_keys(call.request)
        )

    def commit(self, outcomes: list[Any]) -> None:
        """The open transaction committed (its writes' `outcomes`): its links are now stored."""
        for (rollout_id, agent), link in self.pending.items():
            self.committed.setdefault(rollout_id, {})[agent] = link
            self.committed.move_to_end(rollout_id)
        for outcome in outcomes:
            # Ended, or a new attempt: nothing will extend its calls.
            if isinstance(outcome, Rollout) and outcome.status is not Status.RUNNING:
                self.committed.pop(outcome.id, None)
        while len(self.committed) > self.size:
            self.committed.popitem(last=False)
        self.pending.clear()


def chain(
    call: Call, prompt: np.ndarray, response: np.ndarray, chains: Chains, keys: dict[str, Any]
) -> tuple[JSON, JSON | None]:
    """The call's prompt IDs and request as stored (its `base`'s extension, if it has one), and
    `base`. `keys`: its request's `request_keys`."""
    link = chains.get(call.rollout_id, call.agent)
    chains.pending[call.rollout_id, call.agent] = _Link(
        attempt=call.attempt, seq=call.seq, ids=np.concatenate([prompt, response]), keys=keys
    )
    if link is None or link.attempt != call.attempt:
        return {"prompt_ids": prompt.tobytes(), "request": call.request}, None
    n = min(len(prompt), len(link.ids))
    differ = prompt[:n] != link.ids[:n]
    start = n
    if differ.any():
        start = int(differ.argmax())  # the first True
    base: JSON = {"seq": link.seq, "prompt_from": start, "same": [], "from": {}}
    request = dict(call.request)
    for key, value in call.request.items():
        old = link.keys.get(key)
        if old == keys[key]:
            base["same"].append(key)
            request[key] = None
        elif isinstance(old, list) and old and keys[key][: len(old)] == old:
            base["from"][key] = len(old)
            request[key] = value[len(old) :]
    return {"prompt_ids": prompt[start:].tobytes(), "request": request}, base


def request_keys(request: JSON) -> dict[str, Any]:
    """Each of a request's values' fingerprints (`_fingerprints`), by key."""
    return {key: _fingerprints(value) for key, value in request.items()}


def _fingerprints(value: Any) -> Any:
    """A request value's fingerprint; a list's, each item's (so that an extended list is seen)."""
    if isinstance(value, list):
        return [_fingerprint(item) for item in value]
    return _fingerprint(value)


def _unchain(stored: JSON, previous: JSON, base: JSON) -> JSON:
    """A chained call's whole request from its stored one and that of the call it extends."""
    same = set(base["same"])
    extended = base["from"]
    request: JSON = {}
    for key, value in stored.items():
        if key in same:
            request[key] = previous[key]
        elif key in extended:
            request[key] = previous[key][: extended[key]] + value
        else:
            request[key] = value
    return request
