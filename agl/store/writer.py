"""The writer thread: every write of a store, committed in groups, one transaction a group.

- Owns the queue of writes (each with the future its caller waits on), grouping them (waiting up
  to `group_wait_ms` for writers about to write again), the transaction each group runs in, redoing
  a failed group one write at a time so that only the failing write fails, the writer's one
  connection (reopened once the database dropped it) and the chains it keeps (`chains.py`).
- On SQLite, owns the checkpoint thread that copies the write-ahead log into the database beside
  the writer, and the writer's own checkpoint when a burst takes the log past `SQLITE_WAL_BOUND`.
- Does not decide what a write checks or changes (`writes.py` does), nor read for callers: `Store`'s
  reads run on the caller's thread.
"""

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from agl.settings import StoreSettings
from agl.store import writes
from agl.store.chains import MAX_CHAINS, Chains
from agl.store.errors import InvalidData, StoreError, StoreUnavailable
from agl.store.schema import SQLITE_WAL_BOUND

log = logging.getLogger(__name__)


class _Write(NamedTuple):
    """A queued write: the operation, its arguments, and the future its caller waits on."""

    op: Callable[..., Any]
    args: tuple[Any, ...]
    future: "Future[Any]"


def _file_bytes(path: Path) -> int:
    """The size of the file at `path`; 0 when there is none."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _run(conn: Connection, group: list[_Write], chains: Chains) -> list[Any]:
    """Each write's result (a run of call appends: one query per table); raises if a write does."""
    outcomes: list[Any] = []
    for op, run in itertools.groupby(group, key=lambda write: write.op):
        if op is writes.append_calls:
            outcomes += op(conn, [write.args[0] for write in run], chains)
        else:
            outcomes += [op(conn, *write.args) for write in run]
    return outcomes


def _write_error(e: Exception) -> StoreError:
    """What the caller of a lone write that failed gets: a store error (the database's refusal of
    bad data: `InvalidData`), its cause chained."""
    if isinstance(e, StoreError):
        return e
    error = StoreError(f"write failed: {e}")
    if isinstance(e, sa.exc.IntegrityError):
        error = InvalidData(f"rejected by the database: {e.orig}")
    elif isinstance(e, sa.exc.OperationalError):
        error = StoreUnavailable(f"the database cannot be reached: {e.orig}")
    error.__cause__ = e
    return error


class Writer:
    """The store's writer thread, and on SQLite its checkpoint thread. `submit` queues a write from
    any thread; `close` commits what is queued and stops both."""

    def __init__(
        self, url: str, write_engine: Engine, read_engine: Engine, settings: StoreSettings
    ) -> None:
        self.settings = settings
        self._write_engine = write_engine  # one connection, the writer thread's
        self._read_engine = read_engine  # the checkpoints'
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()  # None: stop
        self._conn: Connection | None = None
        self._chains = Chains(MAX_CHAINS)  # the writer thread's only
        self._closed = False
        self._closing = threading.Lock()  # no write is queued behind the stop signal
        self._stopping = threading.Event()  # stops the checkpoint thread
        self._checkpoint_now = threading.Event()  # the log is long: the thread's turn comes early
        self._checkpointing = threading.Lock()  # one checkpoint at a time (SQLite skips a second)
        self._checkpointer: threading.Thread | None = None
        self._wal: Path | None = None  # SQLite's write-ahead log, when the thread checkpoints it
        if url.startswith("sqlite") and settings.sqlite_checkpoint_s:
            self._wal = Path(f"{sa.make_url(url).database}-wal")
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name="agl-store-checkpoint", daemon=True
            )
            self._checkpointer.start()
        # Last: the writer uses all of the above.
        self._thread = threading.Thread(
            target=self._write_loop, name="agl-store-writer", daemon=True
        )
        self._thread.start()

    def close(self) -> bool:
        """Commit what is queued, stop the writer thread and the checkpoint thread; False if it was
        closed before."""
        with self._closing:
            if self._closed:
                return False
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        self._stopping.set()
        self._checkpoint_now.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
        return True

    def submit(self, op: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue a write for the writer thread; its future resolves once it is committed."""
        future: Future[Any] = Future()
        with self._closing:
            if self._closed:
                raise StoreError("store is closed")
            self._queue.put(_Write(op=op, args=args, future=future))
        return future

    def _write_loop(self) -> None:
        """The writer thread: commit what is queued, a group at a time, until the stop signal."""
        expected = 1  # how many writes recent groups held
        stop = False
        while not stop:
            group, stop = self._next_group(expected)
            if not group:
                continue
            try:
                self._commit(group)
            except Exception as e:  # a bug must not leave writers waiting forever
                log.exception("store writer: a group failed unexpectedly")
                for write in group:
                    if not write.future.done():
                        write.future.set_exception(StoreError(f"write failed: {e}"))
            expected = max(len(group), (expected + len(group)) // 2)  # decays after a burst
            if self._wal is not None:
                self._bound_log(_file_bytes(self._wal))
        if self._conn is not None:
            self._conn.close()

    def _next_group(self, expected: int) -> tuple[list[_Write], bool]:
        """The next group of writes, and whether the stop signal followed it. While fewer writes are
        queued than recent groups held (`expected`), wait up to `group_wait_ms` for the rest: their
        writers are about to write again, and one commit beats several."""
        group: list[_Write] = []
        write = self._queue.get()
        deadline = time.monotonic() + self.settings.group_wait_ms / 1000
        while write is not None:
            write.future.set_running_or_notify_cancel()  # from now on its caller cannot cancel it
            group.append(write)
            if len(group) >= self.settings.max_batch:
                break
            wait = 0.0
            if len(group) < expected:
                wait = max(deadline - time.monotonic(), 0)
            try:
                write = self._queue.get(timeout=wait)
            except queue.Empty:
                break
        return group, write is None

    def _commit(self, group: list[_Write], *, retry: bool = True) -> None:
        """One transaction for the group; if it fails, each write again in a transaction of its own
        (a lone write too, on a fresh connection, if the database failed rather than the write)."""
        try:
            if self._conn is None:  # the writer's own connection, kept between groups
                self._conn = self._write_engine.connect()
            with self._conn.begin():
                outcomes = _run(self._conn, group, self._chains)
            self._chains.commit(outcomes)
        except Exception as e:  # noqa: BLE001 - undone; retried alone, or handed to its caller
            self._chains.pending.clear()
            # The database's or the connection's fault, not a refused write.
            fresh = not isinstance(e, StoreError)
            if fresh:
                self._drop_connection()
            if len(group) > 1 or (fresh and retry):
                for write in group:
                    self._commit([write], retry=False)
                return
            outcomes = [_write_error(e)]
        for write, outcome in zip(group, outcomes, strict=True):
            # Cancelled while queued (asyncio cancels a wrapped future): the write stands.
            if write.future.cancelled():
                continue
            if isinstance(outcome, Exception):
                write.future.set_exception(outcome)
            else:
                write.future.set_result(outcome)

    def _bound_log(self, size: int) -> None:
        """SQLite, after a commit: with the log (`size` bytes) past a quarter of its bound, call the
        checkpoint thread at once; past the bound (the thread fallen behind a burst), checkpoint
        here, once the thread's checkpoint is done, so that the next write reuses the log."""
        if size > SQLITE_WAL_BOUND:
            self._checkpoint()
        elif size > SQLITE_WAL_BOUND // 4:
            self._checkpoint_now.set()

    def _checkpoint_loop(self) -> None:
        """SQLite: copy the write-ahead log into the database every `sqlite_checkpoint_s`, or at
        once when the writer finds the log long (`_bound_log`), beside the writer rather than
        inside one of its commits."""
        while True:
            self._checkpoint_now.wait(self.settings.sqlite_checkpoint_s)
            self._checkpoint_now.clear()
            if self._stopping.is_set():
                return
            self._checkpoint()

    def _checkpoint(self) -> None:
        """A passive checkpoint: it waits for no reader or writer; the writer reuses the log from
        its start once a checkpoint has caught up with it. One at a time: SQLite skips a second
        checkpoint while one runs."""
        try:
            with self._checkpointing, self._read_engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except Exception as e:  # noqa: BLE001 - the next one may succeed; the log grows meanwhile
            log.warning("store: WAL checkpoint failed: %s", e)

    def _drop_connection(self) -> None:
        """Close the writer's connection (it may be broken); the next group opens a fresh one."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None
