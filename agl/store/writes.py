"""The write operations: each runs in the writer thread's transaction and raises to undo itself.

- Owns what each write checks and changes: the rollout state machine's moves (`transition`, as
  `types.TRANSITIONS` allows), recording a run of calls (one query per table, each call charged
  against its rollout's storage budget), events and rewards, new tokens, model versions, the
  gateways' registrations and the fleet's pause.
- Owns what lets several stores write one PostgreSQL database: a write locks the rows of the
  rollouts it changes, ends commit in `end_seq` order, and a recorded call names the call it
  extends (`chains.py`).
- Does not begin, commit, retry or group transactions: the writer thread does (`writer.py`). Does
  not check what a caller's arguments are before they are queued: `Store`'s write methods do.
"""

import os
import time
from array import array
from dataclasses import asdict, replace
from typing import Any, NamedTuple

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from agl.store.chains import Chains, chain, request_keys
from agl.store.credentials import Created, hash_token
from agl.store.errors import (
    IllegalTransition,
    InvalidData,
    NotFound,
    OverBudget,
    SecondGateway,
    StoreError,
)
from agl.store.schema import (
    FLEET,
    READ_ROLLOUT,
    calls,
    events,
    fleet,
    fleet_of,
    gateways,
    models,
    rollout_of,
    rollouts,
)
from agl.types import (
    ARRAYS,
    JSON,
    TRANSITIONS,
    Call,
    Charge,
    Event,
    FailureKind,
    Fleet,
    Gateway,
    ModelVersion,
    Rollout,
    Status,
)

# Statements built once: SQLAlchemy then finds them compiled in its cache without rebuilding their
# key.
# The writes' read of a rollout, locked (PostgreSQL; SQLite's BEGIN IMMEDIATE already holds the
# whole database) until the write commits, so that two gateway replicas changing one rollout take
# turns. FOR NO KEY UPDATE: no write changes a rollout's id, and an event or call inserted for it
# (whose foreign key takes a KEY SHARE lock) does not wait for this one.
_ROLLOUT = READ_ROLLOUT.with_for_update(key_share=True)
# SET: the other parameters.
_UPDATE_ROLLOUT = rollouts.update().where(rollouts.c.id == sa.bindparam("rollout_id"))
# What appending a run of calls needs of their rollouts, locked as `_ROLLOUT` is: a replica that
# appends to a rollout another is appending to reads its `n_calls` once the other has committed, so
# seq numbers stay unique and dense. Locked in id order, so two runs never wait on each other.
_RUN_ROWS = (
    sa.select(*rollouts.c["id", "status", "attempt", "n_calls", "sent_bytes"])
    .where(rollouts.c.id.in_(sa.bindparam("ids")))
    .order_by(rollouts.c.id)
    .with_for_update(key_share=True)
)
_INSERT_CALLS = calls.insert()
_INSERT_EVENT = events.insert()
_INSERT_ROLLOUT = rollouts.insert()


def _rollout_row(conn: Connection, rollout_id: str) -> Any:
    """The rollout's row; raises `NotFound`."""
    row = conn.execute(_ROLLOUT, {"rollout_id": rollout_id}).first()
    if row is None:
        raise NotFound(f"unknown rollout {rollout_id!r}")
    return row


def _update_rollout(conn: Connection, row: Any, values: dict[str, Any]) -> Rollout:
    """Change some of a rollout's columns; the rollout as it now is."""
    conn.execute(_UPDATE_ROLLOUT, {"rollout_id": row.id, **values})
    return rollout_of({**row._mapping, **values})


def _insert_event(conn: Connection, rollout_id: str, attempt: int, kind: str, data: JSON) -> Event:
    """Append an event to the rollout's log; the event with its id."""
    now = time.time()
    values = {
        "rollout_id": rollout_id,
        "attempt": attempt,
        "kind": kind,
        "data": data,
        "created_at": now,
    }
    (event_id,) = conn.execute(_INSERT_EVENT, values).inserted_primary_key or (None,)
    return Event(
        rollout_id=rollout_id, kind=kind, data=data, attempt=attempt, id=event_id, created_at=now
    )


def create_rollout(
    conn: Connection, values: dict[str, Any], agent: str, grader: str | None
) -> Created:
    conn.execute(_INSERT_ROLLOUT, values)
    _insert_event(conn, values["id"], 1, "lifecycle", {"to": Status.QUEUED.value})
    return Created(rollout=rollout_of(values), agent_token=agent, grader_token=grader)


def transition(
    conn: Connection,
    rollout_id: str,
    to: Status,
    failure_kind: FailureKind | None,
    reason: str,
    attempt: int | None,
) -> Rollout:
    """Move the rollout to `to`, as `_check_transition` allows."""
    return _move(conn, _rollout_row(conn, rollout_id), to, failure_kind, reason, attempt)


def start(conn: Connection, rollout_id: str, reason: str) -> Rollout:
    """A queued rollout moved to running by its first model call. A rollout already started (its
    first calls reached several gateway replicas at once) or ended stays as it is."""
    row = _rollout_row(conn, rollout_id)
    if row.status != Status.QUEUED:
        return rollout_of(row)
    return _move(conn, row, Status.RUNNING, None, reason, None)


def _move(
    conn: Connection,
    row: Any,
    to: Status,
    failure_kind: FailureKind | None,
    reason: str,
    attempt: int | None,
) -> Rollout:
    """Move the rollout (its locked `row`) to `to`: a lifecycle event, and its columns (a retry
    starts attempt + 1 afresh; an end takes the next `end_seq`)."""
    _check_transition(row, to, failure_kind, attempt)
    if to is Status.TIMED_OUT:  # a time-out is the policy's failure, named or not
        failure_kind = FailureKind.TASK
    attempt_after = row.attempt
    if to is Status.QUEUED:
        attempt_after = row.attempt + 1
    data: JSON = {"from": row.status, "to": to.value, "attempt": attempt_after}
    values: dict[str, Any] = {"status": to.value, "failure_kind": None}
    if failure_kind:
        data["failure_kind"] = failure_kind.value
        values["failure_kind"] = failure_kind.value
    if reason:
        data["reason"] = reason
    if Status(to).terminal:
        _serialize_ends(conn)
    event = _insert_event(conn, row.id, row.attempt, "lifecycle", data)
    if to is Status.QUEUED:  # a fresh attempt
        values.update(attempt=attempt_after, started_at=None, failure_kind=None, reward=None)
    elif to is Status.RUNNING:
        values["started_at"] = event.created_at
    else:
        values.update(ended_at=event.created_at, end_seq=event.id)
    return _update_rollout(conn, row, values)


# PostgreSQL advisory lock (a 64-bit key no other lock of the database uses).
_ENDS_LOCK = 0x61676C_656E6473  # "agl", "ends": orders the ends


def _serialize_ends(conn: Connection) -> None:
    """Holds, until the write commits, the lock that makes ends commit in `end_seq` order.

    `end_seq` is the ending event's id, which the database numbers when the event is inserted, not
    when it commits. With two writers (gateway replicas on PostgreSQL), an end numbered 10 could
    commit after one numbered 11 was read, and `Store.terminal_after`'s cursor would skip it for
    ever. Under this lock an end is numbered only once every earlier one has committed. SQLite
    needs none: `BEGIN IMMEDIATE` already makes its writers take turns."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ENDS_LOCK})


def _check_transition(row: Any, to: Status, kind: FailureKind | None, attempt: int | None) -> None:
    """Raise `IllegalTransition` unless the rollout (its `row`) may move to `to` with `kind`:
    `TRANSITIONS` allows it, `attempt` (if given) is the current one, only an infra failure goes
    back to queued, a failure names its kind, a time-out names none or `task`, and a success or a
    cancel names none."""
    where = f"rollout {row.id}"
    current = Status(row.status)
    if attempt is not None and attempt != row.attempt:
        raise IllegalTransition(
            f"{where}: attempt {attempt} is stale (current attempt {row.attempt})"
        )
    if to not in TRANSITIONS[current]:
        raise IllegalTransition(f"{where}: {current.value} -> {to.value} is not allowed")
    if to is Status.QUEUED and kind is not FailureKind.INFRA:
        raise IllegalTransition(f"{where}: only an infra failure is retried (back to queued)")
    if to is Status.FAILED and kind is None:
        raise IllegalTransition(f"{where}: a failure needs a failure kind (task or infra)")
    if to is Status.TIMED_OUT and kind not in (None, FailureKind.TASK):
        raise IllegalTransition(f"{where}: a time-out is a task failure, not {kind}")
    if to in (Status.SUCCEEDED, Status.CANCELLED) and kind is not None:
        raise IllegalTransition(f"{where}: {to.value} takes no failure kind")


def _encode_call(call: Call, limit: int) -> dict[str, np.ndarray]:
    """A call's token arrays, validated, little-endian; `InvalidData` names what is wrong."""
    where = f"rollout {call.rollout_id}"
    found: dict[str, np.ndarray] = {}
    for name, typecode in ARRAYS.items():
        dtype = np.dtype("<" + typecode)
        # array() is strict: no floats or strings as IDs, nothing out of int32's range.
        try:
            found[name] = np.asarray(array(typecode, getattr(call, name)), dtype)
        except (TypeError, OverflowError, ValueError) as e:
            raise InvalidData(f"{where}: {name}: not an array of {dtype.name}: {e}") from e
        if len(found[name]) > limit:
            raise InvalidData(
                f"{where}: {name}: {len(found[name])} entries, more than the limit of {limit}"
            )
    prompt, response, logprobs = found.values()
    if len(logprobs) != len(response):
        raise InvalidData(f"{where}: {len(response)} response_ids but {len(logprobs)} logprobs")
    if not (np.isfinite(logprobs).all() and (logprobs <= 1e-3).all()):
        raise InvalidData(f"{where}: logprobs must be finite and at most 0")
    if (prompt < 0).any() or (response < 0).any():
        raise InvalidData(f"{where}: negative token id")
    return found


_CALL_COLUMNS = [c.name for c in calls.columns if c.name not in ("id", "base", "request_hash")]


class Append(NamedTuple):
    """A call to record, the most entries a token array may have, its charge, and the stored call
    it follows (`Chains.follow`), if it was read from the store."""

    call: Call
    limit: int
    charge: Charge | None
    follows: Call | None


def _charged(row: Any, sent: int, charge: Charge | None) -> int:
    """The rollout's bytes sent once `charge` is counted on top of `sent`; raises `OverBudget`."""
    if charge is None:
        return sent
    if sent + charge.size > charge.budget:
        raise OverBudget(
            f"rollout {row.id} has sent {sent} bytes; {charge.size} more would pass its storage "
            f"budget of {charge.budget} (AGL_GATEWAY_ROLLOUT_MAX_BYTES)"
        )
    return sent + charge.size


def append_calls(conn: Connection, run: list[Append], chains: Chains) -> list[Any]:
    """Record a run of calls, one query per table (calls are most writes); each as recorded, or
    what kept it out. Each call's charge is counted in the same transaction."""
    ids = list({append.call.rollout_id for append in run})
    rows = {row.id: row for row in conn.execute(_RUN_ROWS, {"ids": ids})}
    outcomes: list[Any] = []
    inserts: list[dict[str, Any]] = []
    next_seq: dict[str, int] = {}
    sent: dict[str, int] = {}
    now = time.time()
    for call, limit, charge, follows in run:
        try:
            arrays = _encode_call(call, limit)
            row = _open_row(call, rows)
            sent[row.id] = _charged(row, sent.get(row.id, row.sent_bytes), charge)
        except StoreError as e:
            outcomes.append(e)
            continue
        seq = next_seq.get(row.id, row.n_calls)
        next_seq[row.id] = seq + 1
        recorded = replace(call, attempt=row.attempt, seq=seq, created_at=now)
        if follows is not None:
            chains.follow(follows)
        keys = request_keys(call.request)
        stored, base = chain(recorded, arrays["prompt_ids"], arrays["response_ids"], chains, keys)
        values = {name: getattr(recorded, name) for name in _CALL_COLUMNS}
        values |= {
            "base": base,
            "response_ids": arrays["response_ids"].tobytes(),
            "logprobs": arrays["logprobs"].tobytes(),
        }
        inserts.append(values | stored)  # `stored`: its prompt IDs and request, as chained
        outcomes.append(recorded)
    if inserts:
        conn.execute(_INSERT_CALLS, inserts)
        counts = [
            {"rollout_id": rid, "n_calls": n, "sent_bytes": sent[rid]}
            for rid, n in next_seq.items()
        ]
        conn.execute(_UPDATE_ROLLOUT, counts)
    return outcomes


def _open_row(call: Call, rows: dict[str, Any]) -> Any:
    """The row of the call's rollout (among `rows`); raises unless it exists and has not ended."""
    row = rows.get(call.rollout_id)
    if row is None:
        raise NotFound(f"unknown rollout {call.rollout_id!r}")
    if Status(row.status).terminal:
        raise IllegalTransition(f"rollout {row.id} has ended ({row.status}); no more calls")
    return row


def append_event(
    conn: Connection, rollout_id: str, kind: str, data: JSON, values: JSON, charge: Charge | None
) -> Event:
    """An event, and the rollout's columns it changes (`values`: a final reward; the bytes sent).
    An event that changes none (the gateway's own: a prefix mismatch, fields not honoured) does not
    lock the rollout: its writer does not wait for another replica's writes to the rollout."""
    if not values and charge is None:
        rows = conn.execute(READ_ROLLOUT, {"rollout_id": rollout_id}).all()
        if not rows:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        return _insert_event(conn, rollout_id, rows[0].attempt, kind, data)
    row = _rollout_row(conn, rollout_id)
    if charge is not None:
        values = values | {"sent_bytes": _charged(row, row.sent_bytes, charge)}
    if values:
        _update_rollout(conn, row, values)
    return _insert_event(conn, rollout_id, row.attempt, kind, data)


def rotate_tokens(
    conn: Connection, rollout_id: str, agent: str, grader: str, attempt: int | None
) -> Created:
    """New token hashes for the rollout's current attempt (a grader's only if it has one)."""
    row = _rollout_row(conn, rollout_id)
    if Status(row.status).terminal or (attempt is not None and attempt != row.attempt):
        raise IllegalTransition(
            f"rollout {rollout_id}: no new tokens ({row.status}, attempt {row.attempt})"
        )
    values = {"agent_token_hash": hash_token(agent), "grader_token_hash": None}
    grader_token = None
    if row.grader_token_hash is not None:
        values["grader_token_hash"] = hash_token(grader)
        grader_token = grader
    _insert_event(conn, rollout_id, row.attempt, "tokens", {"rotated": True})
    rollout = _update_rollout(conn, row, values)
    return Created(rollout=rollout, agent_token=agent, grader_token=grader_token)


def register_model(conn: Connection, model: ModelVersion) -> ModelVersion:
    """Add a model version newer than every other."""
    latest = conn.execute(sa.select(sa.func.max(models.c.version))).scalar()
    if latest is not None and model.version <= latest:
        raise InvalidData(f"model version {model.version} is not newer than the latest, {latest}")
    conn.execute(models.insert(), asdict(model))
    return model


def _fleet(conn: Connection) -> Fleet:
    """The fleet's row, locked until the write commits (PostgreSQL)."""
    return fleet_of(conn.execute(FLEET.with_for_update()).one())


def register_gateway(
    conn: Connection, gateway: Gateway, expired_before: float, single_process: bool
) -> Fleet:
    """Registers a starting gateway, drained for the current pause if there is one (it holds no
    call yet); drops registrations whose heartbeat stopped before `expired_before`, and one at its
    own address (a gateway that listened there has died: this one has its port). With
    `single_process` (SQLite) refuses while another registered gateway's process runs."""
    conn.execute(gateways.delete().where(gateways.c.heartbeat_at < expired_before))
    conn.execute(gateways.delete().where(gateways.c.address == gateway.address))
    if single_process:
        for row in conn.execute(sa.select(gateways)):
            if _process_runs(row.pid):
                raise SecondGateway(
                    f"another gateway (pid {row.pid}, {row.address}) serves from this SQLite "
                    "store, which serves one gateway process; for replicas use PostgreSQL "
                    "(--db postgresql+psycopg://USER:PASSWORD@HOST/DB)"
                )
        conn.execute(gateways.delete())
    state = _fleet(conn)
    drained = 0
    if state.paused:
        drained = state.epoch
    conn.execute(gateways.insert(), asdict(replace(gateway, drained_epoch=drained)))
    return state


def _process_runs(pid: int) -> bool:
    """Whether a process of this machine has this pid (a SQLite store's gateways share one)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def heartbeat(conn: Connection, gateway: Gateway) -> None:
    """A gateway's heartbeat and the latest pause it drained for; registers it again if another
    dropped its registration as expired (it was stalled that long)."""
    values = {"heartbeat_at": gateway.heartbeat_at, "drained_epoch": gateway.drained_epoch}
    updated = conn.execute(gateways.update().where(gateways.c.id == gateway.id).values(values))
    if updated.rowcount == 0:
        conn.execute(gateways.insert(), asdict(gateway))


def deregister_gateway(conn: Connection, gateway_id: str) -> None:
    conn.execute(gateways.delete().where(gateways.c.id == gateway_id))


def pause_fleet(conn: Connection) -> Fleet:
    """Holds every gateway's new calls: a new pause (the next epoch), or the one under way."""
    state = _fleet(conn)
    if state.paused:
        return state
    changed = replace(state, paused=True, epoch=state.epoch + 1, serial=state.serial + 1)
    return _set_fleet(conn, changed)


def resume_fleet(conn: Connection, version: int | None) -> Fleet:
    """Serves the held calls and new ones, under `version` from now on if given."""
    state = _fleet(conn)
    changed = replace(state, paused=False, serial=state.serial + 1)
    if version is not None:
        changed = replace(changed, version=version)
    return _set_fleet(conn, changed)


def _set_fleet(conn: Connection, state: Fleet) -> Fleet:
    conn.execute(fleet.update().where(fleet.c.id == 1).values(asdict(state)))
    return state
