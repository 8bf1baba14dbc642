"""The gateway's routes (DESIGN.md section 3) as FastAPI routers: model calls (`/v1`), a rollout's
own records, the admin API, `/healthz` and `/metrics`, with auth as a dependency. Routes parse
their bodies themselves (`body`) to answer bad input in the caller's wire format, so the OpenAPI
schema shows no request bodies. They do not sample, record (`proxy.py`) or answer errors (`app.py`).
"""

import asyncio
import dataclasses
import json
import time
from asyncio import wrap_future
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import Field, field_validator

from agl.settings import Strict
from agl.store import Created, Store
from agl.types import ARRAYS, JSON, Call, Mode, ModelVersion, Rollout, Status
from gateway import wire
from gateway.auth import Auth, AuthError
from gateway.proxy import Proxy
from gateway.settings import GatewaySettings
from gateway.types import Ask, Completion, Message, RenderError

MAX_DEPTH = 64  # of a request body's JSON: tool schemas nest a few levels; the store's encoder stops near 1,000
Cursor = Annotated[
    int, Query(ge=0, le=2**31 - 1)
]  # compared with INTEGER columns: a larger one overflows PostgreSQL


class SamplingIn(Strict):
    """Sampling the gateway applies to every call of a rollout, whatever the harness asks (e.g. greedy validation)."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)


class RolloutIn(Strict):
    task: JSON = Field(default_factory=dict)
    group: str = Field(min_length=1, max_length=255)
    mode: Mode = Mode.TRAIN
    grader: Any = None
    sampling: SamplingIn | None = None
    metadata: JSON = Field(default_factory=dict)
    token_ttl_s: float | None = Field(
        None, gt=0
    )  # the tokens' lifetime (s); default: the gateway's

    @field_validator("metadata")
    @classmethod
    def _no_sampling(cls, metadata: JSON) -> JSON:
        if "sampling" in metadata:
            raise ValueError("`sampling` is set through the request's own `sampling` field")
        return metadata


class StatusIn(Strict):
    status: Status
    failure_kind: str | None = None
    reason: str = ""
    attempt: int | None = None


class RewardIn(Strict):
    reward: float = Field(allow_inf_nan=False)
    final: bool = True
    call_seq: int | None = None
    source: str = Field("", max_length=255)


class EventIn(Strict):
    kind: str = Field(min_length=1, max_length=32)
    data: JSON = Field(default_factory=dict)


class ModelIn(Strict):
    version: int = Field(ge=0, le=2**31 - 1)  # an INTEGER column
    path: str = ""
    endpoints: list[str] = Field(default_factory=list)
    metadata: JSON = Field(default_factory=dict)


class ResumeIn(Strict):
    version: int | None = Field(None, ge=0)


async def body(request: Request, schema: type[Any]) -> Any:
    """The request's JSON body, validated by `schema`; the raw object stays in `request.state.body`."""
    data = await request.body()
    try:
        raw = orjson.loads(data)  # a quarter of the standard library's time on a harness's body
    except orjson.JSONDecodeError:
        try:  # what only the standard library takes: NaN, integers beyond 64 bits
            raw = json.loads(data)
            json.dumps(
                raw, ensure_ascii=False
            ).encode()  # and lone surrogates, which no tokenizer takes
        except (ValueError, RecursionError) as e:
            raise RenderError(f"the request body is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise RenderError("the request body must be a JSON object")
    level = [
        raw
    ]  # each nesting level in turn: deeper than MAX_DEPTH could not be stored with the call
    for _ in range(MAX_DEPTH):
        level = [
            x
            for v in level
            if isinstance(v, dict | list)
            for x in (v.values() if isinstance(v, dict) else v)
        ]
    if level:
        raise RenderError(f"the request body nests deeper than {MAX_DEPTH} levels")
    request.state.body = raw
    return schema.model_validate(raw)


def _jsonable(record: Any) -> JSON:
    return {k: v.tolist() if k in ARRAYS else v for k, v in dataclasses.asdict(record).items()}


# agl's own event kinds, which no token may post: the gateway's, and those of agl's launchers and reward posts
SYSTEM_EVENTS = {
    "lifecycle",
    "tokens",
    "error",
    "prefix_mismatch",
    "max_tokens_lowered",
    "not_honoured",
}
SYSTEM_EVENTS |= {"launch", "reward"}
GRADER_EVENTS = {
    "flag",
    "swe_patch",
}  # they steer the reward: on a rollout with a grader, not the agent's to post


def harness_routes(proxy: Proxy, auth: Auth) -> APIRouter:
    """The model calls, each with a live rollout's agent token; every reply is recorded first."""
    router = APIRouter()
    Agent = Annotated[Rollout, Depends(auth.agent)]

    def ask(request: Request, rollout: Rollout, api: str, req: wire.Request) -> Ask:
        agent = request.headers.get("x-agl-agent") or req.model or "default"
        if (
            len(agent) > 255 or not agent.isprintable()
        ):  # a stored column and a metric label: no NUL, no megabytes
            raise RenderError(
                "the agent name (x-agl-agent, else model) must be at most 255 printable characters"
            )
        return Ask(rollout, agent, api, request.state.body)

    def answer(req: wire.Request, completions: list[Completion]) -> Response:
        reply = req.reply(completions)
        if req.stream:
            headers = {"Cache-Control": "no-cache"}
            return StreamingResponse(
                req.events(reply), media_type="text/event-stream", headers=headers
            )
        return Response(orjson.dumps(reply), media_type="application/json")

    async def air_penalty(a: Ask, messages: list[Message]) -> JSON | None:
        """AIR: `air_tool_error_reward` for each tool result this request sends back (after its last assistant
        message) that reports an error (`is_error`, or `air_error_pattern` in its text), as the `reward` of the
        agent's call that asked for the tools (its `call_seq`); None when none did, or AIR is off."""
        reward, pattern = proxy.settings.air_tool_error_reward, proxy.settings.air_error_pattern
        start = next(
            (i for i in reversed(range(len(messages))) if messages[i].role == "assistant"), None
        )
        if reward is None or start is None:
            return None
        results = [m for m in messages[start + 1 :] if m.role == "tool"]
        if not (
            failed := sum(
                m.is_error or bool(pattern and pattern.search(m.content)) for m in results
            )
        ):
            return None
        seq = await asyncio.to_thread(proxy.store.last_seq, a.rollout.id, a.agent)
        return {"reward": failed * reward, "call_seq": seq} if seq is not None else None

    def chat(
        api: str, schema: type[wire.ChatRequest | wire.ResponsesRequest | wire.AnthropicRequest]
    ) -> Any:
        async def route(request: Request, rollout: Agent) -> Response:
            await proxy.charge(rollout, len(await request.body()))
            req = await body(request, schema)
            messages, tools, params = req.parse(proxy.renderer.thinking_switch)
            asked = ask(request, rollout, api, req)
            air = await air_penalty(asked, messages)
            reply = answer(req, await proxy.chat(asked, messages, tools, params))
            if air:  # once the call is recorded: a refused request changes nothing stored
                await wrap_future(
                    proxy.store.set_reward(rollout.id, **air, source="air:tool_error", final=False)
                )
            return reply

        return route

    router.post("/v1/chat/completions")(chat("chat", wire.ChatRequest))
    router.post("/v1/responses")(chat("responses", wire.ResponsesRequest))
    router.post("/v1/messages")(chat("messages", wire.AnthropicRequest))

    @router.post("/v1/completions")
    async def completions(request: Request, rollout: Agent) -> Response:
        await proxy.charge(rollout, len(await request.body()))
        req = await body(request, wire.CompletionRequest)
        ids = (
            await asyncio.to_thread(proxy.renderer.encode, req.prompt)
            if isinstance(req.prompt, str)
            else req.prompt
        )
        return answer(
            req, await proxy.complete(ask(request, rollout, "completions", req), ids, req.params())
        )

    @router.get("/v1/models")
    async def models(_: Agent) -> Any:
        return {
            "object": "list",
            "data": [{"id": "agl", "object": "model", "created": 0, "owned_by": "agl"}],
        }

    return router


def rollout_routes(proxy: Proxy, auth: Auth) -> APIRouter:
    """What a rollout's own tokens reach, besides the admin: its records, events, reward and end."""
    router, store = APIRouter(), proxy.store
    Scoped = Annotated[Rollout, Depends(auth.rollout)]

    @router.get("/api/rollouts/{rollout_id}")
    async def get_rollout(rollout: Scoped) -> Any:
        return _jsonable(
            await asyncio.to_thread(store.get_rollout, rollout.id)
        )  # not the cached copy: rewards, calls

    @router.get("/api/rollouts/{rollout_id}/calls")
    async def get_calls(rollout: Scoped, all_attempts: bool = False) -> Any:
        found: dict[str, list[Call]] = await asyncio.to_thread(
            store.calls_for, [rollout.id], all_attempts=all_attempts
        )
        return [_jsonable(c) for c in found[rollout.id]]

    @router.get("/api/rollouts/{rollout_id}/events")
    async def get_events(rollout: Scoped, after: Cursor = 0) -> Any:
        return [
            _jsonable(e) for e in await asyncio.to_thread(store.events, rollout.id, after=after)
        ]

    @router.post("/api/rollouts/{rollout_id}/events")
    async def post_event(request: Request, rollout: Scoped) -> Any:
        if (poster := getattr(request.state, "credential", "admin")) != "admin":
            await proxy.charge(rollout, len(await request.body()))
        req = await body(request, EventIn)
        steering = req.kind in GRADER_EVENTS and rollout.has_grader and poster == "agent token"
        if poster != "admin" and (req.kind in SYSTEM_EVENTS or steering):
            raise AuthError(403, f"events of kind {req.kind!r} cannot be posted with the {poster}")
        event = _jsonable(await wrap_future(store.append_event(rollout.id, req.kind, req.data)))
        return {
            k: v for k, v in event.items() if k != "data"
        }  # not echoed back: it can be megabytes

    @router.post("/api/rollouts/{rollout_id}/reward")
    async def post_reward(
        request: Request, rollout: Annotated[Rollout, Depends(auth.reward)]
    ) -> Any:
        req = await body(request, RewardIn)
        source = req.source or getattr(request.state, "credential", "admin")
        done = store.set_reward(
            rollout.id, req.reward, source=source, final=req.final, call_seq=req.call_seq
        )
        return _jsonable(await wrap_future(done))

    @router.post("/api/rollouts/{rollout_id}/status")
    async def post_status(
        request: Request, rollout: Annotated[Rollout, Depends(auth.reward)]
    ) -> Any:
        """The admin moves a rollout anywhere `TRANSITIONS` allows; its token (the one that posts its reward)
        may only start or end it: an applied Job reports its own end (`controller/report.py`)."""
        req = await body(request, StatusIn)
        if hasattr(request.state, "credential") and req.status in (Status.QUEUED, Status.CANCELLED):
            raise AuthError(
                403, f"the {request.state.credential} cannot move its rollout to {req.status.value}"
            )
        try:
            done = store.transition(rollout.id, req.status, **req.model_dump(exclude={"status"}))
            rollout = await wrap_future(done)
        finally:
            auth.tokens.changed(rollout.id)
        if rollout.status.terminal or rollout.status is Status.QUEUED:
            proxy.forget(rollout.id)
        return _jsonable(rollout)

    return router


def admin_routes(settings: GatewaySettings, store: Store, proxy: Proxy, auth: Auth) -> APIRouter:
    """The admin API; the admin key is checked where the router is mounted (`gateway/app.py`)."""
    router = APIRouter()

    def credentials(created: Created) -> JSON:
        """What a launcher needs to run an attempt: the tokens (now known to the cache) and where harnesses call."""
        auth.tokens.issued(created)
        public = (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
        out = {
            "id": created.rollout.id,
            "attempt": created.rollout.attempt,
            "agent_token": created.agent_token,
        }
        out |= {"base_url": public + "/v1", "anthropic_base_url": public}
        return out | ({"grader_token": created.grader_token} if created.grader_token else {})

    @router.post("/api/rollouts")
    async def create_rollout(request: Request) -> Any:
        req = await body(request, RolloutIn)
        metadata = req.metadata | (
            {"grader": req.grader} if req.grader not in (None, False) else {}
        )
        if req.sampling and (sampling := req.sampling.model_dump(exclude_none=True)):
            metadata["sampling"] = sampling
        grader, ttl_s = bool(req.grader), req.token_ttl_s or settings.token_ttl_s
        made = store.create_rollout(
            req.task, req.group, req.mode, grader=grader, metadata=metadata, token_ttl_s=ttl_s
        )
        return credentials(await wrap_future(made))

    @router.post("/api/rollouts/{rollout_id}/tokens")
    async def rotate_tokens(rollout_id: str, attempt: int | None = None) -> Any:
        try:
            made = store.rotate_tokens(
                rollout_id, attempt=attempt, token_ttl_s=settings.token_ttl_s
            )
            created = await wrap_future(made)
        finally:
            auth.tokens.changed(rollout_id)  # the old tokens are dead
        return credentials(created)  # new ones for a launcher, as a create gives

    @router.get("/api/rollouts")
    async def list_rollouts(
        status: Status | None = None,
        group: str | None = None,
        after: Cursor | None = None,
        limit: int = 100,
        offset: Cursor = 0,
    ) -> Any:
        limit = max(1, min(limit, 10_000))
        if after is not None:
            found = await asyncio.to_thread(store.terminal_after, after, limit)
        else:
            found = await asyncio.to_thread(
                store.list_rollouts, status=status, group=group, limit=limit, offset=offset
            )
        return [_jsonable(r) for r in found]

    @router.post("/api/models")
    async def register_model(request: Request) -> Any:
        req = await body(request, ModelIn)
        return _jsonable(await wrap_future(store.register_model(ModelVersion(**req.model_dump()))))

    @router.post("/api/pause")
    async def pause() -> Any:
        started = time.monotonic()
        await proxy.gate.pause()
        return {"drained_s": round(time.monotonic() - started, 4)} | proxy.state()

    @router.post("/api/resume")
    async def resume(request: Request) -> Any:
        req = await body(request, ResumeIn) if await request.body() else ResumeIn()
        proxy.version = proxy.version if req.version is None else req.version
        proxy.gate.resume()
        return proxy.state()

    @router.get("/api/state")
    async def state() -> Any:
        latest, last_end = (
            await asyncio.to_thread(store.latest_model),
            await asyncio.to_thread(store.last_end),
        )
        return proxy.state() | {
            "latest_model": _jsonable(latest) if latest else None,
            "last_end": last_end,
        }

    return router


def open_routes(store: Store, proxy: Proxy) -> APIRouter:
    """`/healthz` and `/metrics`, without credentials."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> Any:
        return {
            "ok": True,
            "started_at": proxy.started,
        } | proxy.state()  # a controller learns of restarts

    @router.get("/metrics")
    async def metrics() -> Response:
        for status, count in (await asyncio.to_thread(store.status_counts)).items():
            proxy.metrics.rollouts.labels(status).set(count)
        return Response(
            generate_latest(proxy.metrics.registry), media_type="text/plain; version=0.0.4"
        )

    return router
