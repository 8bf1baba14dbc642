"""Who may call what: the FastAPI dependencies that authenticate each route, and the cache of
token lookups behind them.

A credential is the admin key, or a rollout's agent or grader token, sent as `Authorization:
Bearer`, as `x-api-key` or in the `/r/{token}` path prefix. A token reaches only its own live
rollout and never the admin routes; only the agent token calls the model, and only the grader
token posts the reward of a rollout that has a grader. Errors are `AuthError`s with the status
to answer; `gateway/app.py` maps them to replies.
"""

from __future__ import annotations

import asyncio
import hmac
from asyncio import wrap_future
from collections import OrderedDict

from fastapi import Request

from agl.store import Created, IllegalTransition, Store, hash_token, token_expired
from agl.types import Rollout, Status


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Tokens:
    """Token hash -> (rollout, role), read from the store once. This gateway is the store's only
    writer, so it keeps the entries current: `changed` is told of every status change it makes and
    `issued` of the tokens it hands out. A read that was under way during a change is not cached
    (`changes` counts them)."""

    def __init__(self, store: Store, size: int = 100_000) -> None:
        self.store, self.size = store, size
        self.found: OrderedDict[str, tuple[Rollout, str]] = OrderedDict()
        self.of_rollout: dict[str, set[str]] = {}  # rollout id -> its cached token hashes
        self.changes = 0

    async def lookup(self, token: str) -> tuple[Rollout, str] | None:
        if token_expired(token):
            raise AuthError(401, "this token has expired; a launcher gets new ones from /api/rollouts/{id}/tokens")
        digest = hash_token(token)
        if digest in self.found:
            return self.found[digest]
        changes = self.changes
        found = await asyncio.to_thread(self.store.rollout_for_token, token)
        if found is not None and changes == self.changes:
            self._add(digest, *found)
        return found

    def issued(self, created: Created) -> None:
        """Tokens this gateway just handed out: known without a read on their first call."""
        self._add(hash_token(created.agent_token), created.rollout, "agent")
        if created.grader_token:
            self._add(hash_token(created.grader_token), created.rollout, "grader")

    def changed(self, rollout_id: str, now: Rollout | None = None) -> None:
        """A rollout changed: its entries get its new state, or are dropped when it is not known."""
        self.changes += 1
        for digest in list(self.of_rollout.get(rollout_id, ())):
            if now is not None and digest in self.found:
                self.found[digest] = (now, self.found[digest][1])
            else:
                self.found.pop(digest, None)
                self.of_rollout[rollout_id].discard(digest)

    def _add(self, digest: str, rollout: Rollout, role: str) -> None:
        self.found[digest] = (rollout, role)
        self.of_rollout.setdefault(rollout.id, set()).add(digest)
        while len(self.found) > self.size:
            old, (evicted, _) = self.found.popitem(last=False)
            self.of_rollout.get(evicted.id, set()).discard(old)


def _ended(rollout: Rollout) -> AuthError:
    return AuthError(403, f"rollout {rollout.id} has ended ({rollout.status.value})")


class Auth:
    """The dependencies, one per kind of route. All are `async def`: FastAPI runs a plain `def`
    dependency on its thread pool, a round trip no harness call should pay."""

    def __init__(self, admin_key: str, store: Store) -> None:
        self.admin_key, self.store = admin_key, store
        self.tokens = Tokens(store)

    @staticmethod
    def presented(request: Request) -> str:
        token = request.scope.get("agl_path_token") or request.headers.get("x-api-key", "")
        auth = request.headers.get("authorization", "")
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        return str(token)

    def is_admin(self, request: Request) -> bool:
        return bool(self.admin_key) and hmac.compare_digest(self.presented(request), self.admin_key)

    async def admin(self, request: Request) -> None:
        """The admin key."""
        if not self.is_admin(request):
            raise AuthError(401 if not self.presented(request) else 403, "the admin key is required")

    async def agent(self, request: Request) -> Rollout:
        """A live rollout's agent token; the first call starts a queued rollout."""
        token = self.presented(request)
        if not token:
            raise AuthError(401, "missing API key: use the rollout's agent token")
        found = await self.tokens.lookup(token)
        if found is None:
            raise AuthError(401, "invalid API key")
        rollout, role = found
        request.state.rollout = rollout  # its error replies are recorded as events
        if role != "agent":
            raise AuthError(403, "the grader token cannot call the model")
        if rollout.status.terminal:
            raise _ended(rollout)
        if rollout.status is not Status.QUEUED:
            return rollout
        try:
            rollout = await wrap_future(self.store.transition(rollout.id, Status.RUNNING, reason="first model call"))
        except IllegalTransition:  # started (or ended) by someone else meanwhile
            self.tokens.changed(rollout.id)
            rollout = await asyncio.to_thread(self.store.get_rollout, rollout.id)
            if rollout.status.terminal:
                raise _ended(rollout) from None
            return rollout
        self.tokens.changed(rollout.id, rollout)
        return rollout

    async def rollout(self, request: Request, rollout_id: str) -> Rollout:
        """The admin key, or a token of this very rollout while it is live."""
        return await self._scoped(request, rollout_id, reward=False)

    async def reward(self, request: Request, rollout_id: str) -> Rollout:
        """As `rollout`, but of a rollout with a grader only the grader token."""
        return await self._scoped(request, rollout_id, reward=True)

    async def _scoped(self, request: Request, rollout_id: str, *, reward: bool) -> Rollout:
        if self.is_admin(request):
            return await asyncio.to_thread(self.store.get_rollout, rollout_id)
        token = self.presented(request)
        found = await self.tokens.lookup(token) if token else None
        if found is None:
            raise AuthError(401, "the admin key or this rollout's token is required")
        rollout, role = found
        if rollout.id != rollout_id:
            raise AuthError(403, "this token belongs to another rollout")
        if reward and role == "agent" and rollout.has_grader:
            raise AuthError(403, "this rollout has a grader: only the grader token may post its reward")
        if rollout.status.terminal:
            raise _ended(rollout)
        return rollout
