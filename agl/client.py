"""A small typed client for the gateway's admin API (`/api`), for the controller and the trainer.

Replies become `agl.types` records, failures `GatewayError` (the HTTP status, 0 when the gateway
was not reached). It does not retry, cache, or judge a failure: callers do. aiohttp, not httpx: at
a controller's hundreds of concurrent requests httpx's pool ate its CPU (bench/controller.py:
25 -> 74/s).
"""

from array import array
from typing import Any, Self

import aiohttp

from agl.types import ARRAYS, JSON, Call, FailureKind, Mode, Rollout, Status

KEEPALIVE_S = 4.0  # idle connections are dropped before a server (uvicorn, sglang: 5 s) closes them


class GatewayError(Exception):
    """A request the gateway refused (`status`: its HTTP status) or never answered (`status` 0)."""

    def __init__(self, status: int, message: str) -> None:
        if status:
            super().__init__(f"gateway {status}: {message}")
        else:
            super().__init__(f"gateway unreachable: {message}")
        self.status = status
        self.message = message


def call_from_json(data: JSON) -> Call:
    """A call as `GET /api/rollouts/{id}/calls` lists it (token arrays as JSON lists)."""
    fields = {k: v for k, v in data.items() if k in Call.__dataclass_fields__}
    fields |= {name: array(typecode, data[name]) for name, typecode in ARRAYS.items()}
    return Call(**fields)


class GatewayClient:
    """Async admin client: `async with GatewayClient(url, key) as gw: await gw.get_rollout(id)`."""

    http: aiohttp.ClientSession  # opened by `async with`

    def __init__(self, url: str, admin_key: str, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {admin_key}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def __aenter__(self) -> Self:
        # Made in the event loop that uses it. aiohttp keeps idle connections 15 s: a server that closed one
        # as a request went out on it failed the request ("Server disconnected").
        connector = aiohttp.TCPConnector(limit=32, keepalive_timeout=KEEPALIVE_S)
        self.http = aiohttp.ClientSession(
            headers=self.headers, timeout=self.timeout, connector=connector
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.close()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The reply's JSON; `GatewayError` for a status of 400 or more, or no reply at all."""
        try:
            async with self.http.request(method, self.url + path, **kwargs) as reply:
                if reply.status >= 400:
                    raise GatewayError(reply.status, (await reply.text())[:500])
                return await reply.json()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise GatewayError(0, f"{method} {path}: {e!r}") from e

    async def create_rollout(
        self,
        task: JSON,
        group: str,
        *,
        mode: Mode | str = Mode.TRAIN,
        grader: Any = None,
        metadata: JSON | None = None,
        sampling: JSON | None = None,
        token_ttl_s: float | None = None,
    ) -> JSON:
        """A new rollout: its id, tokens (only ever shown here) and base URLs. `sampling`
        ({"temperature", "top_p", "top_k"}) overrides what the harness asks on every call;
        `token_ttl_s`: else the gateway's."""
        body = {
            "task": task,
            "group": group,
            "mode": str(mode),
            "grader": grader,
            "metadata": metadata or {},
        }
        if sampling:
            body["sampling"] = sampling
        if token_ttl_s:
            body["token_ttl_s"] = token_ttl_s
        return await self._request("POST", "/api/rollouts", json=body)

    async def rotate_tokens(self, rollout_id: str, *, attempt: int | None = None) -> JSON:
        """New tokens for the rollout's current attempt (the old ones die); same shape as a create."""
        params: dict[str, str] = {}
        if attempt is not None:
            params["attempt"] = str(attempt)
        return await self._request("POST", f"/api/rollouts/{rollout_id}/tokens", params=params)

    async def health(self) -> JSON:
        """`/healthz`: `ok`, `started_at` (when the gateway process started, its clock), pause state."""
        return await self._request("GET", "/healthz")

    async def get_rollout(self, rollout_id: str) -> Rollout:
        found = await self._request("GET", f"/api/rollouts/{rollout_id}")
        return Rollout.from_dict(found)

    async def list_rollouts(
        self,
        *,
        status: Status | None = None,
        group: str | None = None,
        after: int | None = None,
        limit: int = 1000,
    ) -> list[Rollout]:
        """Rollouts by status and group; with `after` (an `end_seq`), those that ended after it, in
        the order they ended."""
        given = {"limit": limit, "after": after, "status": status, "group": group}
        params = {k: str(v) for k, v in given.items() if v not in (None, "")}
        found = await self._request("GET", "/api/rollouts", params=params)
        return [Rollout.from_dict(r) for r in found]

    async def set_status(
        self,
        rollout_id: str,
        status: Status | str,
        *,
        failure_kind: FailureKind | str | None = None,
        reason: str = "",
        attempt: int | None = None,
    ) -> Rollout:
        """Move the rollout (`attempt`: only if it is still that attempt); the rollout as it is now."""
        body = {
            "status": Status(status).value,
            "failure_kind": failure_kind,
            "reason": reason[:2000],
            "attempt": attempt,
        }
        moved = await self._request("POST", f"/api/rollouts/{rollout_id}/status", json=body)
        return Rollout.from_dict(moved)

    async def post_event(self, rollout_id: str, kind: str, data: JSON | None = None) -> JSON:
        """Append an event to the rollout's log (the admin may post any kind)."""
        body = {"kind": kind, "data": data or {}}
        return await self._request("POST", f"/api/rollouts/{rollout_id}/events", json=body)

    async def events(self, rollout_id: str) -> list[JSON]:
        """The rollout's log, every attempt's, oldest first."""
        return await self._request("GET", f"/api/rollouts/{rollout_id}/events")

    async def calls(self, rollout_id: str) -> list[JSON]:
        """The calls of the rollout's current attempt, token arrays as JSON lists."""
        return await self._request("GET", f"/api/rollouts/{rollout_id}/calls")

    async def pause(self) -> JSON:
        """Hold new harness calls; returns once no call is in flight."""
        return await self._request("POST", "/api/pause")

    async def resume(self, version: int | None = None) -> JSON:
        """Let held calls through, served from now on as model `version`."""
        return await self._request("POST", "/api/resume", json={"version": version})

    async def register_model(
        self, version: int, *, path: str = "", endpoints: list[str] | None = None
    ) -> JSON:
        """Register a new policy version (`path`: its weights; `endpoints`: the engines serving it)."""
        body = {"version": version, "path": path, "endpoints": endpoints or []}
        return await self._request("POST", "/api/models", json=body)

    async def state(self) -> JSON:
        """Paused or not, the served version, calls in flight and held, the latest model, the last
        `end_seq`."""
        return await self._request("GET", "/api/state")
