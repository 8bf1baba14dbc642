"""`Store`: the store's API, one thread-safe handle on one database.

- Owns opening a database (its engines and migrating it: `schema.py`), checking each write's
  arguments before handing it to the writer thread (`writer.py`), and every read: rollouts, calls
  (read back whole through their chains: `chains.py`), events, model versions, gateways and the
  fleet. Reads run on the caller's thread, on reader connections that see the latest commit.
- Does not run a write itself: `writes.py` does, on the writer thread, and each write returns a
  `concurrent.futures.Future` that resolves once committed.
- Does not authenticate anyone (it keeps only token hashes), speak HTTP, or decide policy such as
  when to retry: the gateway and the controller do.
"""

import contextlib
import math
import re
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from agl.settings import StoreSettings
from agl.store import writes
from agl.store.chains import BASE_SEQ, calls_of, chain_rows
from agl.store.credentials import Created, hash_token, new_token
from agl.store.errors import (
    IllegalTransition,
    InvalidData,
    NotFound,
    StoreUnavailable,
)
from agl.store.schema import (
    FLEET,
    READ_ROLLOUT,
    calls,
    events,
    fleet_of,
    gateways,
    make_engine,
    migrate,
    models,
    rollout_of,
    rollouts,
)
from agl.store.writer import Writer
from agl.types import (
    JSON,
    Call,
    Charge,
    Event,
    FailureKind,
    Fleet,
    Gateway,
    Mode,
    ModelVersion,
    Rollout,
    Status,
)

# Joins a call to its rollout when it is of the rollout's current attempt.
_CURRENT_ATTEMPT = sa.and_(
    rollouts.c.id == calls.c.rollout_id, rollouts.c.attempt == calls.c.attempt
)
# The reads' statements, built once: SQLAlchemy then finds them compiled in its cache without
# rebuilding their key.
_LIVE_GATEWAYS = (
    sa.select(gateways)
    .where(gateways.c.heartbeat_at >= sa.bindparam("alive_since"))
    .order_by(gateways.c.id)
)
# The fleet's row and how many other gateways are alive: what every gateway reads ten times a
# second (`gateway/fleet.py`), in one round trip.
_LIVE_PEERS = (
    sa.select(sa.func.count())
    .select_from(gateways)
    .where(
        gateways.c.heartbeat_at >= sa.bindparam("alive_since"),
        gateways.c.id != sa.bindparam("gateway_id"),
    )
    .scalar_subquery()
)
_FLEET_AND_PEERS = FLEET.add_columns(_LIVE_PEERS.label("peers"))
# The rollout a token's hash belongs to.
_TOKEN_HOLDER = sa.select(rollouts).where(
    sa.or_(
        rollouts.c.agent_token_hash == sa.bindparam("digest"),
        rollouts.c.grader_token_hash == sa.bindparam("digest"),
    )
)
# The rollouts some tokens' hashes belong to.
_TOKEN_HOLDERS = sa.select(rollouts).where(
    sa.or_(
        rollouts.c.agent_token_hash.in_(sa.bindparam("digests", expanding=True)),
        rollouts.c.grader_token_hash.in_(sa.bindparam("digests", expanding=True)),
    )
)
# A rollout's last `n` calls of its current attempt (their seqs end at its `n_calls` - 1): a
# range of the (rollout_id, seq) index, whatever the planner's statistics; read with the calls
# they extend (`chain_rows`).
_LAST_ROWS = chain_rows(
    sa.select(calls.c.seq, BASE_SEQ.label("base")).where(
        calls.c.rollout_id == sa.bindparam("rollout_id"),
        calls.c.seq
        >= sa.select(rollouts.c.n_calls - sa.bindparam("n"))
        .where(rollouts.c.id == sa.bindparam("rollout_id"))
        .scalar_subquery(),
        calls.c.attempt
        == sa.select(rollouts.c.attempt)
        .where(rollouts.c.id == sa.bindparam("rollout_id"))
        .scalar_subquery(),
    )
)


class Store(contextlib.AbstractContextManager["Store"]):
    """Thread-safe handle on one database: `Store(url)` migrates it and starts the writer. Reads
    block (from asyncio: `await asyncio.to_thread(store.get_rollout, id)`); writes return a
    Future."""

    def __init__(self, url: str | None = None, settings: StoreSettings | None = None) -> None:
        self.settings = settings or StoreSettings()
        # psycopg 3's dialect for a plain PostgreSQL URL.
        self.url = re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", url or self.settings.url)
        self._write_engine = make_engine(self.url, self.settings, writer=True)
        # SQLite serves one gateway process (`SecondGateway`); PostgreSQL, replicas.
        self.single_process = self._write_engine.dialect.name == "sqlite"
        try:
            migrate(self._write_engine)
        except BaseException:
            self._write_engine.dispose()
            raise
        self._read_engine = make_engine(self.url, self.settings, writer=False)
        self._writer = Writer(self.url, self._write_engine, self._read_engine, self.settings)

    def close(self) -> None:
        """Commit what is queued, stop the writer, release connections."""
        if not self._writer.close():
            return  # closed before
        self._write_engine.dispose()
        self._read_engine.dispose()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes: each returns a Future that resolves once committed

    def create_rollout(
        self,
        task: JSON,
        group: str,
        mode: Mode | str = Mode.TRAIN,
        *,
        grader: bool = False,
        metadata: JSON | None = None,
        token_ttl_s: float | None = None,
    ) -> Future[Created]:
        """A new queued rollout with fresh tokens (a grader's too, with `grader`); its `Created`
        holds the tokens in plaintext, the only time they are."""
        if not isinstance(task, dict):
            raise InvalidData("task must be a JSON object")
        if not isinstance(group, str) or not 0 < len(group) <= 255:
            raise InvalidData("group must be a non-empty string of at most 255 characters")
        try:
            mode = Mode(mode)
        except ValueError as e:
            raise InvalidData(f"mode must be one of {[m.value for m in Mode]}, not {mode!r}") from e
        agent = new_token(token_ttl_s)
        values = {
            "task": task,
            "group_id": group,
            "mode": mode.value,
            "metadata": metadata or {},
            "n_calls": 0,
            "id": uuid.uuid4().hex,
            "status": Status.QUEUED.value,
            "attempt": 1,
            "created_at": time.time(),
            "agent_token_hash": hash_token(agent),
            "grader_token_hash": None,
        }
        grader_token = None
        if grader:
            grader_token = new_token(token_ttl_s)
            values["grader_token_hash"] = hash_token(grader_token)
        return self._writer.submit(writes.create_rollout, values, agent, grader_token)

    def transition(
        self,
        rollout_id: str,
        to: Status | str,
        *,
        failure_kind: FailureKind | str | None = None,
        reason: str = "",
        attempt: int | None = None,
    ) -> Future[Rollout]:
        """Move a rollout along `types.TRANSITIONS` (illegal moves raise); `to=queued` retries an
        infra failure as attempt + 1. `attempt`, when given, must be the current one: a stale
        controller cannot end a new one."""
        kind = None
        try:
            target = Status(to)
            if failure_kind is not None:
                kind = FailureKind(failure_kind)
        except ValueError as e:
            raise IllegalTransition(str(e)) from e
        return self._writer.submit(writes.transition, rollout_id, target, kind, reason, attempt)

    def start(self, rollout_id: str, reason: str) -> Future[Rollout]:
        """Start a queued rollout; one already started or ended resolves as it is."""
        return self._writer.submit(writes.start, rollout_id, reason)

    def append_call(
        self, call: Call, charge: Charge | None = None, *, follows: Call | None = None
    ) -> Future[Call]:
        """Record a call under its rollout's current attempt; resolves to it with attempt and seq
        (not its id). `charge`: counted against the rollout's storage budget in the same
        transaction (`OverBudget`: nothing recorded). `follows`: the rollout's last call, read
        whole (`last_calls`), that this one continues: it is stored as its extension."""
        append = writes.Append(
            call=call, limit=self.settings.max_tokens_per_array, charge=charge, follows=follows
        )
        return self._writer.submit(writes.append_calls, append)

    def append_event(
        self, rollout_id: str, kind: str, data: JSON | None = None, charge: Charge | None = None
    ) -> Future[Event]:
        """Append an event of `kind` to the rollout's log, under its current attempt; `charge` as
        `append_call`'s."""
        if not isinstance(kind, str) or not 0 < len(kind) <= 32:
            raise InvalidData("event kind must be a non-empty string of at most 32 characters")
        if data is not None and not isinstance(data, dict):
            raise InvalidData("event data must be a JSON object")
        return self._writer.submit(writes.append_event, rollout_id, kind, data or {}, {}, charge)

    def set_reward(
        self,
        rollout_id: str,
        reward: float,
        *,
        source: str = "harness",
        final: bool = True,
        call_seq: int | None = None,
    ) -> Future[Event]:
        """Record a reward event; a final reward also becomes the rollout's reward."""
        if (
            isinstance(reward, bool)
            or not isinstance(reward, int | float)
            or not math.isfinite(reward)
        ):
            raise InvalidData(f"reward must be a finite number, not {reward!r}")
        data = {"value": float(reward), "source": source, "final": final, "call_seq": call_seq}
        columns = {}
        if final:
            columns["reward"] = float(reward)
        return self._writer.submit(writes.append_event, rollout_id, "reward", data, columns, None)

    def rotate_tokens(
        self, rollout_id: str, *, attempt: int | None = None, token_ttl_s: float | None = None
    ) -> Future[Created]:
        """New tokens for a rollout that has not ended (the old ones die), for a launcher that did
        not create it."""
        agent = new_token(token_ttl_s)
        grader = new_token(token_ttl_s)
        return self._writer.submit(writes.rotate_tokens, rollout_id, agent, grader, attempt)

    def register_model(self, model: ModelVersion) -> Future[ModelVersion]:
        """Add a policy version; versions only grow."""
        if model.version < 0:
            raise InvalidData("model version must be >= 0")
        if not model.created_at:
            model = replace(model, created_at=time.time())
        return self._writer.submit(writes.register_model, model)

    # ---- reads

    def _read(self, statement: sa.Executable, parameters: JSON | None = None) -> list[Any]:
        """The statement's rows, on a reader connection (autocommit: the latest commit).
        `parameters`: its bound parameters' values (a statement built once is found compiled in
        SQLAlchemy's cache; `statement.params(...)` would copy it first). A connection the server
        has closed (a restart, a proxy's idle timeout) is found when used: the read is tried once
        more, on a fresh one."""
        try:
            try:
                return self._rows(statement, parameters)
            except sa.exc.DBAPIError as e:
                if not e.connection_invalidated:
                    raise
                return self._rows(statement, parameters)
        except sa.exc.OperationalError as e:
            raise StoreUnavailable(f"the database cannot be reached: {e.orig}") from e

    def _rows(self, statement: sa.Executable, parameters: JSON | None) -> list[Any]:
        with self._read_engine.connect() as conn:
            return list(conn.execute(statement, parameters))

    def get_rollout(self, rollout_id: str) -> Rollout:
        rows = self._read(READ_ROLLOUT, {"rollout_id": rollout_id})
        if not rows:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        return rollout_of(rows[0])

    def rollout_for_token(self, token: str) -> tuple[Rollout, str] | None:
        """The rollout a token belongs to and the token's role, `agent` or `grader`."""
        digest = hash_token(token)
        rows = self._read(_TOKEN_HOLDER, {"digest": digest})
        if not rows:
            return None
        if rows[0].agent_token_hash == digest:
            return rollout_of(rows[0]), "agent"
        return rollout_of(rows[0]), "grader"

    def token_holders(self, digests: list[str]) -> dict[str, tuple[Rollout, str]]:
        """`rollout_for_token` of many tokens at once, by their hashes (`hash_token`): one read.
        A hash no rollout holds (now) is left out."""
        asked = set(digests)
        found = {}
        for row in self._read(_TOKEN_HOLDERS, {"digests": digests}):
            rollout = rollout_of(row)
            if row.agent_token_hash in asked:
                found[row.agent_token_hash] = (rollout, "agent")
            if row.grader_token_hash in asked:
                found[row.grader_token_hash] = (rollout, "grader")
        return found

    def list_rollouts(
        self,
        *,
        status: Status | str | None = None,
        group: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts by status and group, oldest first."""
        query = (
            sa.select(rollouts)
            .order_by(rollouts.c.created_at, rollouts.c.id)
            .limit(limit)
            .offset(offset)
        )
        if status is not None:
            query = query.where(rollouts.c.status == Status(status).value)
        if group is not None:
            query = query.where(rollouts.c.group_id == group)
        return [rollout_of(row) for row in self._read(query)]

    def terminal_after(self, cursor: int = 0, limit: int = 1000) -> list[Rollout]:
        """Rollouts that ended after `cursor`, in the order they ended. The next cursor is the last
        one's `end_seq`: ends commit in `end_seq` order, whatever the writers
        (`writes._serialize_ends`), so paging this way sees each once."""
        query = (
            sa.select(rollouts)
            .where(rollouts.c.end_seq > cursor)
            .order_by(rollouts.c.end_seq)
            .limit(limit)
        )
        return [rollout_of(row) for row in self._read(query)]

    def calls_for(
        self, rollout_ids: Iterable[str], *, all_attempts: bool = False
    ) -> dict[str, list[Call]]:
        """The calls of many rollouts at once, in order; by default only each one's last attempt."""
        result: dict[str, list[Call]] = {rid: [] for rid in rollout_ids}
        query = (
            sa.select(calls)
            .where(calls.c.rollout_id.in_(list(result)))
            .order_by(calls.c.rollout_id, calls.c.seq)
        )
        if not all_attempts:
            query = query.join(rollouts, _CURRENT_ATTEMPT)
        for call in calls_of(self._read(query)):
            result[call.rollout_id].append(call)
        return result

    def last_calls(self, rollout_id: str, n: int = 1, *, known: Call | None = None) -> list[Call]:
        """The last `n` calls of the rollout's current attempt, in order, each read whole through
        the chain of calls it extends (its agent's earlier calls), back to one stored whole or to
        `known`, a call of the rollout the caller holds whole: no other call is read. A gateway
        replica passes the last call it recorded or read, and a call recorded after it read one is
        stored as that call's extension (`append_call`'s `follows`): then this reads a link or
        two, however long the conversation. One query (`chain_rows`), one round trip."""
        if n <= 0:
            return []
        known_seq = -1
        if known is not None:
            known_seq = known.seq
        rows = self._read(_LAST_ROWS, {"rollout_id": rollout_id, "n": n, "known": known_seq})
        return list(calls_of(rows, known))[-n:]

    def last_seq(self, rollout_id: str, agent: str) -> int | None:
        """The seq of the agent's last call in the rollout's current attempt (None: it made none)."""
        query = sa.select(sa.func.max(calls.c.seq)).join(rollouts, _CURRENT_ATTEMPT)
        query = query.where(calls.c.rollout_id == rollout_id, calls.c.agent == agent)
        return self._read(query)[0][0]

    def events(self, rollout_id: str, *, after: int = 0) -> list[Event]:
        """The rollout's log, all attempts, oldest first (`after`: only events with a larger id)."""
        query = (
            sa.select(events)
            .where(events.c.rollout_id == rollout_id, events.c.id > after)
            .order_by(events.c.id)
        )
        return [Event(**row._mapping) for row in self._read(query)]

    def sent_bytes(self, rollout_id: str) -> int:
        """The bytes its calls' and events' requests have sent, against its storage budget (all
        attempts, counted as each was recorded, by every gateway)."""
        query = sa.select(rollouts.c.sent_bytes).where(rollouts.c.id == rollout_id)
        rows = self._read(query)
        if not rows:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        return int(rows[0][0])

    def status_counts(self) -> dict[str, int]:
        """Rollouts by status (every status listed)."""
        rows = self._read(sa.select(rollouts.c.status, sa.func.count()).group_by(rollouts.c.status))
        return {s.value: 0 for s in Status} | {row[0]: int(row[1]) for row in rows}

    def models(self) -> list[ModelVersion]:
        """Every model version, oldest first."""
        rows = self._read(sa.select(models).order_by(models.c.version))
        return [ModelVersion(**row._mapping) for row in rows]

    def last_end(self) -> int:
        """`terminal_after`'s cursor at the last rollout to have ended (0: none has)."""
        return int(self._read(sa.select(sa.func.max(rollouts.c.end_seq)))[0][0] or 0)

    def register_gateway(self, gateway: Gateway, *, expired_before: float) -> Future[Fleet]:
        """Registers a starting gateway (see `writes.register_gateway`); the fleet's state."""
        return self._writer.submit(
            writes.register_gateway, gateway, expired_before, self.single_process
        )

    def heartbeat(self, gateway: Gateway) -> Future[None]:
        return self._writer.submit(writes.heartbeat, gateway)

    def deregister_gateway(self, gateway_id: str) -> Future[None]:
        return self._writer.submit(writes.deregister_gateway, gateway_id)

    def pause_fleet(self) -> Future[Fleet]:
        """Holds every gateway's new calls; the pause's state (its epoch)."""
        return self._writer.submit(writes.pause_fleet)

    def resume_fleet(self, version: int | None = None) -> Future[Fleet]:
        return self._writer.submit(writes.resume_fleet, version)

    def fleet_and_peers(self, gateway_id: str, *, alive_since: float) -> tuple[Fleet, int]:
        """What every gateway follows (paused or not, the pause's epoch, the version served), and
        how many registered gateways but `gateway_id` have a heartbeat not older than
        `alive_since`: one read."""
        values = {"gateway_id": gateway_id, "alive_since": alive_since}
        [row] = self._read(_FLEET_AND_PEERS, values)
        return fleet_of(row), int(row.peers)

    def gateways(self, *, alive_since: float = 0.0) -> list[Gateway]:
        """The registered gateways whose heartbeat is not older than `alive_since`."""
        rows = self._read(_LIVE_GATEWAYS, {"alive_since": alive_since})
        return [Gateway(**row._mapping) for row in rows]

    def latest_model(self) -> ModelVersion | None:
        """The newest model version, or None before the first is registered."""
        rows = self._read(sa.select(models).order_by(models.c.version.desc()).limit(1))
        if not rows:
            return None
        return ModelVersion(**rows[0]._mapping)
