"""The database's shape and how it is opened: the tables, their engines, their migrations.

- Owns the tables (SQLAlchemy Core `metadata`, which the Alembic environment in
  `agl/migrations/env.py` compares against), the statements that reads and writes share, the
  conversion of a rollout's and the fleet's rows into domain records, the engines (SQLite in WAL
  mode with its pragmas, PostgreSQL's pools) and migrating a database to this code's head revision.
- Does not change the schema on its own: the tables change only through the migrations in
  `agl/migrations/versions/`, and a database migrated by a newer agl is refused (`SchemaTooNew`).
- Does not read or write a record: `store.py` reads, `writes.py` writes.
"""

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from agl.settings import StoreSettings
from agl.store.errors import SchemaTooNew, StoreError
from agl.types import Fleet, Rollout

metadata = sa.MetaData()

rollouts = sa.Table(
    "rollouts",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("task", sa.JSON, nullable=False),
    sa.Column("group_id", sa.String(255), nullable=False, index=True),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("reward", sa.Float, nullable=True),
    sa.Column("failure_kind", sa.String(16), nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("agent_token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("grader_token_hash", sa.String(64), nullable=True, unique=True),
    sa.Column("n_calls", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("ended_at", sa.Float, nullable=True),
    sa.Column("end_seq", sa.Integer, nullable=True, unique=True),
    # Bytes its tokens' recorded requests and posted events have sent, against its budget.
    sa.Column("sent_bytes", sa.BigInteger, nullable=False, server_default="0"),
)

calls = sa.Table(
    "calls",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("rollout_id", sa.String(64), sa.ForeignKey("rollouts.id"), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("agent", sa.String(255), nullable=False),
    sa.Column("model_version", sa.Integer, nullable=False),
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("response", sa.JSON, nullable=False),
    sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
    sa.Column("response_ids", sa.LargeBinary, nullable=False),
    sa.Column("logprobs", sa.LargeBinary, nullable=False),
    sa.Column("finish_reason", sa.String(32), nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("temperature", sa.Float, nullable=True),  # NULL: recorded before 0002 (unknown)
    # What it extends (`chains.py`); NULL: stored whole.
    sa.Column("base", sa.JSON(none_as_null=True), nullable=True),
    # The gateway (its `gateways.id`) that recorded it; NULL: recorded before 0004.
    sa.Column("gateway", sa.String(64), nullable=True),
    # Its request's fingerprint, which gateways read to find a retry before #58; since, they read
    # the last call whole (`Store.last_calls`) and it is no longer written (NULL).
    sa.Column("request_hash", sa.String(32), nullable=True),
    sa.UniqueConstraint("rollout_id", "seq", name="uq_calls_rollout_seq"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("rollout_id", sa.String(64), sa.ForeignKey("rollouts.id"), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_events_rollout", "rollout_id", "id"),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("endpoints", sa.JSON, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

# The gateways serving from this database (replicas, or one process): registered at start, each
# with a heartbeat, and the pause epoch each last drained for.
gateways = sa.Table(
    "gateways",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("address", sa.String(255), nullable=False),  # host:port, for people
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("drained_epoch", sa.Integer, nullable=False),
)

# One row (id 1): whether the gateways hold new calls, the pause's number, the version served.
fleet = sa.Table(
    "fleet",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("version", sa.Integer, nullable=True),  # None: the latest registered model
    sa.Column("serial", sa.Integer, nullable=False),  # counts its changes: newer reads win
)

MIGRATIONS = Path(__file__).parent.parent / "migrations"
# SQLite: the write-ahead log's size past which the writer checkpoints it itself (bytes), when the
# checkpoint thread falls behind a burst of writes; the thread keeps it smaller in steady traffic.
SQLITE_WAL_BOUND = 64 * 2**20
# PostgreSQL advisory lock (a 64-bit key no other lock of the database uses).
_MIGRATE_LOCK = 0x61676C_6D6967  # "agl", "mig": one migration at a time

# Statements that reads and writes share, built once: SQLAlchemy then finds them compiled in its
# cache without rebuilding their key.
READ_ROLLOUT = sa.select(rollouts).where(rollouts.c.id == sa.bindparam("rollout_id"))
FLEET = sa.select(fleet).where(fleet.c.id == 1)


def rollout_of(row: Any) -> Rollout:
    """A rollout from its row, or from a dict of its column values (those left out: unset)."""
    values = row
    if not isinstance(row, dict):
        values = row._mapping
    has_grader = values.get("grader_token_hash") is not None
    return Rollout.from_dict({**values, "group": values["group_id"], "has_grader": has_grader})


def fleet_of(row: Any) -> Fleet:
    """The fleet's state from its row."""
    return Fleet(paused=row.paused, epoch=row.epoch, version=row.version, serial=row.serial)


def make_engine(url: str, settings: StoreSettings, *, writer: bool) -> Engine:
    """An engine for the writer (one connection) or the readers; SQLite in WAL mode, its writer's
    transactions taking the write lock at BEGIN. PostgreSQL's readers run each statement in
    autocommit and are not pinged before use: a read is one round trip, not four (ping, BEGIN, the
    statement, ROLLBACK); `Store._read` reconnects once if the server closed the connection."""
    if not url.startswith("sqlite"):
        if writer:
            return sa.create_engine(url, pool_pre_ping=True, pool_size=1)
        return sa.create_engine(url, pool_size=8, isolation_level="AUTOCOMMIT")
    if url in ("sqlite://", "sqlite:///:memory:"):
        raise StoreError(
            "an in-memory SQLite store cannot be shared between threads; use a file URL"
        )
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below own transactions
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        if writer and settings.sqlite_checkpoint_s:
            # The store checkpoints the log itself (`Writer._checkpoint`), never inside a commit.
            # A log grown past a quarter of its bound is cut back to that once reused, so that
            # the file's size says how long the log is (the writer calls the checkpoint thread
            # early past it: a high-water mark left there called it after every commit).
            dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")
            dbapi_conn.execute(f"PRAGMA journal_size_limit={SQLITE_WAL_BOUND // 4}")

    if writer:  # reads run in autocommit: each statement sees the latest commit

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # The write lock at once, not at the first write; on a driver cursor, as SQLAlchemy's
            # execute costs more.
            conn.connection.cursor().execute("BEGIN IMMEDIATE")

    return engine


def migrate(engine: Engine) -> None:
    """Bring the schema to this code's head revision; refuse a database that is ahead of it."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    known = {script.revision for script in ScriptDirectory.from_config(cfg).walk_revisions()}
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Replicas starting at once on a new database: one migrates, the others then find it
            # done (two at once collided on creating the tables).
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATE_LOCK})
        current = MigrationContext.configure(conn).get_current_revision()
        if current is not None and current not in known:
            raise SchemaTooNew(
                f"the database's schema revision {current!r} is newer than this agl knows "
                f"({', '.join(sorted(known))}); upgrade agl to open it"
            )
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
