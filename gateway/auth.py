"""Who may call what: the FastAPI dependencies that authenticate each route, and their token cache.

A credential (the admin key, or a rollout's agent or grader token) comes as `Authorization:
Bearer`, `x-api-key` or the `/r/{token}` path prefix. A token reaches only its own live rollout,
never the admin routes; only the agent token calls the model, and only the grader token posts
the reward of a rollout with a grader. Each dependency leaves the request's `Caller` (its role,
and its rollout for a token) in `request.state.caller`, for routes to read (`caller_of`). It
raises `AuthError`s; `gateway/app.py` answers them.
"""

import asyncio
import enum
import hmac
import time
from collections import defaultdict
from dataclasses import dataclass

from fastapi import Request

from agl.store import Created, Store, hash_token, token_expired
from agl.types import Rollout, Status


class AuthError(Exception):
    """A request refused for its credential: `status` 401 (none, or not known) or 403 (known, but
    not allowed here)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Role(enum.Enum):
    """Who holds a credential: the admin key, or a rollout's agent or grader token."""

    ADMIN = "admin"
    AGENT = "agent"
    GRADER = "grader"


@dataclass(frozen=True)
class Caller:
    """Who made a request: a role, and for a token the rollout it belongs to (as cached)."""

    role: Role
    rollout: Rollout | None = None

    @property
    def credential(self) -> str:
        """The credential's name, in messages and as a reward's source: `admin`, `agent token` or
        `grader token`."""
        if self.role is Role.ADMIN:
            return "admin"
        return f"{self.role.value} token"


def caller_of(request: Request) -> Caller:
    """The request's caller, as its route's auth dependency found it."""
    caller: Caller = request.state.caller
    return caller


class Tokens:
    """Token hash -> (rollout, role), read at most every `TTL_S` (a store read per call costs a
    fifth of the gateway's CPU, measured). The gateway keeps it current with its own changes:
    `issued` adds the tokens it hands out (reads of new tokens race other changes under load),
    `changed` follows each change to a rollout, and a read that overlapped a change is not cached
    (`changes` counts them). Another replica's changes (an end, rotated tokens) are seen once the
    entry is `TTL_S` old: until then this gateway still admits the old token, and the store refuses
    the calls it records to a rollout that ended. Entries that old are read again together, in one
    read (`_refresh`): a replica that serves every rollout's calls would otherwise read each
    rollout's token every `TTL_S`. A gateway alone on a store that serves one gateway process
    (SQLite) is its only writer, and reads each token once. At most `size` tokens are kept, the
    oldest dropped first."""

    TTL_S = 2.0  # with replicas
    REFRESH = 1000  # most entries read again in one read

    def __init__(self, store: Store, size: int = 100_000) -> None:
        self.store = store
        self.size = size
        self.found: dict[str, tuple[Rollout, Role]] = {}  # oldest first
        self.read_at: dict[str, float] = {}  # when each was read or changed (monotonic s)
        # rollout id -> its cached token hashes
        self.of_rollout: defaultdict[str, set[str]] = defaultdict(set)
        self.changes = 0
        self._refreshing = asyncio.Lock()

    async def lookup(self, token: str) -> tuple[Rollout, Role] | None:
        if token_expired(token):
            raise AuthError(
                401,
                "this token has expired; a launcher gets new ones from /api/rollouts/{id}/tokens",
            )
        digest = hash_token(token)
        if digest in self.found and not self._fresh(digest):
            await self._refresh()
        if digest in self.found and self._fresh(digest):
            return self.found[digest]
        changes = self.changes
        found = await asyncio.to_thread(self.store.rollout_for_token, token)
        if found is None:
            return None
        rollout, role = found
        if changes == self.changes:
            self._add(digest, rollout, Role(role))
        return rollout, Role(role)

    def _fresh(self, digest: str) -> bool:
        """Whether a cached entry may be used without reading it again."""
        return self.store.single_process or time.monotonic() - self.read_at[digest] < self.TTL_S

    async def _refresh(self) -> None:
        """Reads the entries `TTL_S` old again (the oldest `REFRESH`), in one read; a token no
        longer its rollout's (rotated) is dropped. Lookups meanwhile wait for this read rather
        than make their own. An entry changed during the read keeps its change."""
        async with self._refreshing:
            stale: dict[str, float] = {}  # digest -> when it was read
            for digest in self.found:  # oldest first: the stale ones lead
                if self._fresh(digest) or len(stale) == self.REFRESH:
                    break
                stale[digest] = self.read_at[digest]
            if not stale:
                return  # read by the refresh this lookup waited for
            holders = await asyncio.to_thread(self.store.token_holders, list(stale))
            for digest, read_at in stale.items():
                if self.read_at.get(digest) != read_at:
                    continue  # changed (or dropped) meanwhile
                if digest in holders:
                    rollout, role = holders[digest]
                    self._add(digest, rollout, Role(role))
                else:
                    self._drop(digest)

    def issued(self, created: Created) -> None:
        self._add(hash_token(created.agent_token), created.rollout, Role.AGENT)
        if created.grader_token:
            self._add(hash_token(created.grader_token), created.rollout, Role.GRADER)

    def changed(self, rollout_id: str, now: Rollout | None = None) -> None:
        """A rollout changed: its entries get its new state `now`, or go (its tokens may be
        rotated)."""
        self.changes += 1
        for digest in self.of_rollout.pop(rollout_id, ()):
            _, role = self.found.pop(digest)
            del self.read_at[digest]
            if now is not None:
                self._add(digest, now, role)

    def _add(self, digest: str, rollout: Rollout, role: Role) -> None:
        self.found.pop(digest, None)  # a re-read entry is the newest
        self.found[digest] = (rollout, role)
        self.read_at[digest] = time.monotonic()
        self.of_rollout[rollout.id].add(digest)
        if len(self.found) > self.size:
            self._drop(next(iter(self.found)))

    def _drop(self, digest: str) -> None:
        """Drops a token from the cache, and its rollout's entry with its last token."""
        rollout, _ = self.found.pop(digest)
        del self.read_at[digest]
        digests = self.of_rollout[rollout.id]
        digests.discard(digest)
        if not digests:
            del self.of_rollout[rollout.id]


def _ended(rollout: Rollout) -> AuthError:
    return AuthError(403, f"rollout {rollout.id} has ended ({rollout.status.value})")


class Auth:
    """The dependencies, one per kind of route. All are `async def`: FastAPI runs a plain `def`
    dependency on its thread pool, a round trip no harness call should pay."""

    def __init__(self, admin_key: str, store: Store) -> None:
        self.admin_key = admin_key
        self.store = store
        self.tokens = Tokens(store)

    @staticmethod
    def presented(request: Request) -> str:
        """The credential the request presents: its `/r/{token}` prefix, `x-api-key` or bearer."""
        token = request.scope.get("agl_path_token") or request.headers.get("x-api-key", "")
        auth = request.headers.get("authorization", "")
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        return str(token)

    def is_admin(self, request: Request) -> bool:
        # compared as bytes: a str must be ASCII
        presented = self.presented(request).encode(errors="surrogatepass")
        key = self.admin_key.encode(errors="surrogatepass")
        return bool(key) and hmac.compare_digest(presented, key)

    async def admin(self, request: Request) -> None:
        """The admin key."""
        if self.is_admin(request):
            request.state.caller = Caller(role=Role.ADMIN)
            return
        if not self.presented(request):
            raise AuthError(401, "the admin key is required")
        raise AuthError(403, "the admin key is required")

    async def agent(self, request: Request) -> Rollout:
        """A live rollout's agent token; the first call starts a queued rollout."""
        token = self.presented(request)
        if not token:
            raise AuthError(401, "missing API key: use the rollout's agent token")
        found = await self.tokens.lookup(token)
        if found is None:
            raise AuthError(401, "invalid API key")
        rollout, role = found
        if role is not Role.AGENT:
            raise AuthError(403, "the grader token cannot call the model")
        if rollout.status is Status.QUEUED:
            rollout = await self._start(rollout)
        if rollout.status.terminal:
            raise _ended(rollout)
        request.state.caller = Caller(role=Role.AGENT, rollout=rollout)
        # Its error replies are recorded as events; a refused token writes nothing.
        request.state.rollout = rollout
        return rollout

    async def _start(self, rollout: Rollout) -> Rollout:
        """A queued rollout, started by its first model call (or as someone else left it)."""
        rollout = await asyncio.wrap_future(self.store.start(rollout.id, "first model call"))
        self.tokens.changed(rollout.id, rollout)
        return rollout

    async def rollout(self, request: Request, rollout_id: str) -> Rollout:
        """The admin key, or a token of this very rollout while it is live."""
        if self.is_admin(request):
            request.state.caller = Caller(role=Role.ADMIN)
            return await asyncio.to_thread(self.store.get_rollout, rollout_id)
        token = self.presented(request)
        found = None
        if token:
            found = await self.tokens.lookup(token)
        if found is None:
            raise AuthError(401, "the admin key or this rollout's token is required")
        rollout, role = found
        request.state.caller = Caller(role=role, rollout=rollout)
        if rollout.id != rollout_id:
            raise AuthError(403, "this token belongs to another rollout")
        if rollout.status.terminal:
            raise _ended(rollout)
        return rollout

    async def reward(self, request: Request, rollout_id: str) -> Rollout:
        """As `rollout`, but of a rollout with a grader only the grader token."""
        rollout = await self.rollout(request, rollout_id)
        if rollout.has_grader and caller_of(request).role is Role.AGENT:
            raise AuthError(
                403, "this rollout has a grader: only the grader token may post its reward"
            )
        return rollout
