"""Who may call what: the FastAPI dependencies that authenticate each route, and their token cache.

A credential (the admin key, or a rollout's agent or grader token) comes as `Authorization:
Bearer`, `x-api-key` or the `/r/{token}` path prefix. A token reaches only its own live rollout,
never the admin routes; only the agent token calls the model, and only the grader token posts
the reward of a rollout with a grader. It raises `AuthError`s; `gateway/app.py` answers them.
"""

import asyncio
import hmac
from collections import defaultdict

from fastapi import Request

from agl.store import Created, IllegalTransition, Store, hash_token, token_expired
from agl.types import Rollout, Status


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Tokens:
    """Token hash -> (rollout, role), read once (a store read per call costs a fifth of the gateway's
    CPU, measured). The gateway, the store's only writer, keeps it current: `issued` adds the tokens
    it hands out (reads of new tokens race other changes under load), `changed` follows each change
    to a rollout, and a read that overlapped a change is not cached (`changes` counts them)."""

    def __init__(self, store: Store, size: int = 100_000) -> None:
        self.store, self.size = store, size
        self.found: dict[str, tuple[Rollout, str]] = {}  # oldest first
        self.of_rollout: defaultdict[str, set[str]] = defaultdict(
            set
        )  # rollout id -> its cached token hashes
        self.changes = 0

    async def lookup(self, token: str) -> tuple[Rollout, str] | None:
        if token_expired(token):
            raise AuthError(
                401,
                "this token has expired; a launcher gets new ones from /api/rollouts/{id}/tokens",
            )
        digest = hash_token(token)
        if digest in self.found:
            return self.found[digest]
        changes = self.changes
        found = await asyncio.to_thread(self.store.rollout_for_token, token)
        if found is not None and changes == self.changes:
            self._add(digest, *found)
        return found

    def issued(self, created: Created) -> None:
        self._add(hash_token(created.agent_token), created.rollout, "agent")
        if created.grader_token:
            self._add(hash_token(created.grader_token), created.rollout, "grader")

    def changed(self, rollout_id: str, now: Rollout | None = None) -> None:
        """A rollout changed: its entries get its new state `now`, or go (its tokens may be rotated)."""
        self.changes += 1
        for digest in self.of_rollout.pop(rollout_id, ()):
            _, role = self.found.pop(digest)
            if now is not None:
                self._add(digest, now, role)

    def _add(self, digest: str, rollout: Rollout, role: str) -> None:
        self.found[digest] = (rollout, role)
        self.of_rollout[rollout.id].add(digest)
        if len(self.found) > self.size:
            oldest = next(iter(self.found))
            self.of_rollout[self.found.pop(oldest)[0].id].discard(oldest)


def _ended(rollout: Rollout) -> AuthError:
    return AuthError(403, f"rollout {rollout.id} has ended ({rollout.status.value})")


class Auth:
    """The dependencies, one per kind of route. All are `async def`: FastAPI runs a plain `def`
    dependency on its thread pool, a round trip no harness call should pay."""

    def __init__(self, admin_key: str, store: Store) -> None:
        self.admin_key, self.store, self.tokens = admin_key, store, Tokens(store)

    @staticmethod
    def presented(request: Request) -> str:
        token = request.scope.get("agl_path_token") or request.headers.get("x-api-key", "")
        auth = request.headers.get("authorization", "")
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        return str(token)

    def is_admin(self, request: Request) -> bool:
        presented, key = (
            s.encode(errors="surrogatepass") for s in (self.presented(request), self.admin_key)
        )
        return bool(key) and hmac.compare_digest(presented, key)  # bytes: a str must be ASCII

    async def admin(self, request: Request) -> None:
        if not self.is_admin(request):
            raise AuthError(
                401 if not self.presented(request) else 403, "the admin key is required"
            )

    async def agent(self, request: Request) -> Rollout:
        """A live rollout's agent token; the first call starts a queued rollout."""
        token = self.presented(request)
        if not token:
            raise AuthError(401, "missing API key: use the rollout's agent token")
        found = await self.tokens.lookup(token)
        if found is None:
            raise AuthError(401, "invalid API key")
        rollout, role = found
        if role != "agent":
            raise AuthError(403, "the grader token cannot call the model")
        if rollout.status is Status.QUEUED:
            started = self.store.transition(rollout.id, Status.RUNNING, reason="first model call")
            try:
                rollout = await asyncio.wrap_future(started)
                self.tokens.changed(rollout.id, rollout)
            except IllegalTransition:  # started (or ended) by someone else meanwhile
                self.tokens.changed(rollout.id)
                rollout = await asyncio.to_thread(self.store.get_rollout, rollout.id)
        if rollout.status.terminal:
            raise _ended(rollout)
        request.state.rollout = (
            rollout  # its error replies are recorded as events; a refused token writes nothing
        )
        return rollout

    async def rollout(self, request: Request, rollout_id: str) -> Rollout:
        """The admin key, or a token of this very rollout while it is live."""
        if self.is_admin(request):
            return await asyncio.to_thread(self.store.get_rollout, rollout_id)
        token = self.presented(request)
        found = await self.tokens.lookup(token) if token else None
        if found is None:
            raise AuthError(401, "the admin key or this rollout's token is required")
        rollout, role = found
        request.state.credential = (
            f"{role} token"  # for `reward` and the reward's source (admin key: none)
        )
        if rollout.id != rollout_id:
            raise AuthError(403, "this token belongs to another rollout")
        if rollout.status.terminal:
            raise _ended(rollout)
        return rollout

    async def reward(self, request: Request, rollout_id: str) -> Rollout:
        """As `rollout`, but of a rollout with a grader only the grader token."""
        rollout = await self.rollout(request, rollout_id)
        if rollout.has_grader and getattr(request.state, "credential", "admin") == "agent token":
            raise AuthError(
                403, "this rollout has a grader: only the grader token may post its reward"
            )
        return rollout
