"""The store's errors: what a read or a write raises when it cannot do what was asked.

- Owns one exception per way a store operation fails, all under `StoreError`: a missing record,
  a move the rollout state machine refuses, bad data, a budget passed, an unreachable database,
  a schema newer than this code, a second gateway on a SQLite store.
- Does not map them to HTTP status codes or retry anything: the gateway and the controller do.
"""


class StoreError(Exception):
    """Base of the store's errors."""


class NotFound(StoreError):
    """A rollout (or other record) that does not exist."""


class IllegalTransition(StoreError):
    """A status change the rollout state machine does not allow, or a write to an ended rollout."""


class InvalidData(StoreError):
    """A malformed, oversized or inconsistent record; nothing was written."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer agl than this one."""


class OverBudget(StoreError):
    """A write that would take its rollout past its storage budget; nothing was written."""


class StoreUnavailable(StoreError):
    """The database could not be reached; nothing was written."""


class SecondGateway(StoreError):
    """A second gateway process on a SQLite store, which serves one."""
