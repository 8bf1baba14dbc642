"""The durable store: rollouts, calls, events and model versions (docs/architecture.md, "The data model").

- Owns the schema (changed only by the Alembic migrations in `agl/migrations/`), the rollout state
  machine, the token arrays' layout (little-endian int32 IDs, float32 logprobs) and the calls'
  chains: a call is stored as the extension of its agent's previous call, and read back whole.
- Writes: one writer thread commits them in groups; each returns a `concurrent.futures.Future`
  that resolves once committed. An acknowledged write is durable; a failing one changes nothing
  and the rest of its group commits without it.
- Replicas: several stores may write one PostgreSQL database at once. A write locks the rows of
  the rollouts it changes, ends commit in `end_seq` order, and a call's chain names the call it
  extends.
- Reads run on the caller's thread.
- Does not authenticate anyone (it keeps only token hashes), speak HTTP, or decide policy such
  as when to retry: the gateway and the controller do.

This package re-exports the public names; its modules, in reading order:
- `store.py`: `Store`, the API: opening a database, the reads, each write's checks.
- `writes.py`: what each write checks and changes, inside the writer's transaction.
- `writer.py`: `Writer`, the thread that groups writes and commits them; SQLite's checkpoints.
- `chains.py`: a call stored as the extension of its agent's previous call, and read back whole.
- `schema.py`: the tables, the engines, migrating.
- `credentials.py`: tokens and their hashes; `Created`.
- `errors.py`: the store's exceptions.
"""

from agl.store.chains import MAX_CHAINS
from agl.store.credentials import Created, hash_token, new_token, token_expired
from agl.store.errors import (
    IllegalTransition,
    InvalidData,
    NotFound,
    OverBudget,
    SchemaTooNew,
    SecondGateway,
    StoreError,
    StoreUnavailable,
)
from agl.store.schema import (
    MIGRATIONS,
    SQLITE_WAL_BOUND,
    calls,
    events,
    fleet,
    gateways,
    metadata,
    models,
    rollouts,
)
from agl.store.store import Store

__all__ = [
    "MAX_CHAINS",
    "MIGRATIONS",
    "SQLITE_WAL_BOUND",
    "Created",
    "IllegalTransition",
    "InvalidData",
    "NotFound",
    "OverBudget",
    "SchemaTooNew",
    "SecondGateway",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "calls",
    "events",
    "fleet",
    "gateways",
    "hash_token",
    "metadata",
    "models",
    "new_token",
    "rollouts",
    "token_expired",
]
