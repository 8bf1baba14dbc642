"""The gateway's routes: the model calls (`/v1`), which `Admission` serves ahead of FastAPI's
routing and which check their token themselves, and as FastAPI routers, with auth as a dependency,
the model list, a rollout's own records, the admin API, `/healthz` and `/metrics`. Routes parse
their bodies themselves (`body`) to answer bad input in the caller's wire format, so the OpenAPI
schema shows no request bodies. They do not sample, record (`proxy.py`) or answer errors
(`app.py`).
"""

import asyncio
import dataclasses
import json
from asyncio import wrap_future
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import Field, field_validator

from agl.settings import Strict
from agl.store import Created, Store
from agl.types import ARRAYS, JSON, Call, Charge, Mode, ModelVersion, Rollout, Status
from gateway import errors, wire
from gateway.auth import Auth, AuthError, Caller, Role, caller_of
from gateway.fleet import Replicas
from gateway.proxy import Proxy
from gateway.settings import GatewaySettings
from gateway.types import CONTENT, REASONING, Ask, Completion, Live, Part, RenderError

# Of a request body's JSON: tool schemas nest a few levels; the store's encoder stops near 1,000.
MAX_DEPTH = 64
# Compared with INTEGER columns: a larger one overflows PostgreSQL.
Cursor = Annotated[int, Query(ge=0, le=2**31 - 1)]


class SamplingIn(Strict):
    """Sampling the gateway applies to every call of a rollout, whatever the harness asks (e.g.
    greedy validation)."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)


class RolloutIn(Strict):
    """A rollout to create: its task, group and mode, grader, sampling and metadata."""

    task: JSON = Field(default_factory=dict)
    group: str = Field(min_length=1, max_length=255)
    mode: Mode = Mode.TRAIN
    grader: Any = None
    sampling: SamplingIn | None = None
    metadata: JSON = Field(default_factory=dict)
    # the tokens' lifetime (s); default: the gateway's
    token_ttl_s: float | None = Field(None, gt=0)

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
    version: int | None = Field(None, ge=0, le=2**31 - 1)  # kept in an INTEGER column


async def body(request: Request, schema: type[Any]) -> Any:
    """The request's JSON body, validated by `schema`; the raw object stays in
    `request.state.body`."""
    raw = _loads(await request.body())
    if not isinstance(raw, dict):
        raise RenderError("the request body must be a JSON object")
    _check_depth(raw)
    request.state.body = raw
    return schema.model_validate(raw)


async def body_or_defaults(request: Request, schema: type[Any]) -> Any:
    """As `body`, but an empty body is the schema's defaults."""
    if not await request.body():
        return schema()
    return await body(request, schema)


def _loads(data: bytes) -> Any:
    """JSON as the standard library takes it, parsed fast where orjson can."""
    try:
        # a quarter of the standard library's time on a harness's body
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    # What only the standard library takes: NaN, integers beyond 64 bits; and lone surrogates,
    # which no tokenizer takes, are refused.
    try:
        raw = json.loads(data)
        json.dumps(raw, ensure_ascii=False).encode()
    except (ValueError, RecursionError) as e:
        raise RenderError(f"the request body is not valid JSON: {e}") from e
    return raw


def _check_depth(raw: JSON) -> None:
    """Refuses JSON deeper than MAX_DEPTH, which could not be stored with the call; each nesting
    level in turn, until one holds nothing (a harness's body: five or six levels)."""
    level: list[Any] = [raw]
    for _ in range(MAX_DEPTH):
        level = [
            x
            for v in level
            if isinstance(v, dict | list)
            for x in (v.values() if isinstance(v, dict) else v)
        ]
        if not level:
            return
    raise RenderError(f"the request body nests deeper than {MAX_DEPTH} levels")


def _jsonable(record: Any) -> JSON:
    return {k: v.tolist() if k in ARRAYS else v for k, v in dataclasses.asdict(record).items()}


# agl's own event kinds, which no token may post: the gateway's, and those of agl's launchers and
# reward posts
SYSTEM_EVENTS = {
    "lifecycle",
    "tokens",
    "error",
    "prefix_mismatch",
    "max_tokens_lowered",
    "not_honoured",
    "launch",
    "reward",
}
# They steer the reward: on a rollout with a grader, not the agent's to post.
GRADER_EVENTS = {"flag", "swe_patch"}


def may_post(caller: Caller, rollout: Rollout, kind: str) -> bool:
    """Whether the caller may post an event of `kind` on the rollout: the admin any; a token no
    system event, and an agent token no event that steers the reward of a rollout with a grader."""
    if caller.role is Role.ADMIN:
        return True
    if kind in SYSTEM_EVENTS:
        return False
    return not (caller.role is Role.AGENT and rollout.has_grader and kind in GRADER_EVENTS)


def may_move(caller: Caller, status: Status) -> bool:
    """Whether the caller may move a rollout to `status`: the admin anywhere `TRANSITIONS` allows;
    its token (the one that posts its reward) may only start or end it: an applied Job reports
    its own end (`controller/report.py`)."""
    return caller.role is Role.ADMIN or status not in (Status.QUEUED, Status.CANCELLED)


# ---------------------------------------------------------------------------- model calls


def _ask(request: Request, rollout: Rollout, api: str, req: wire.Request, charge: Charge) -> Ask:
    """The call as received; its agent is named by `x-agl-agent`, else the request's model."""
    agent = request.headers.get("x-agl-agent") or req.model or "default"
    # A stored column and a metric label: no NUL, no megabytes.
    if len(agent) > 255 or not agent.isprintable():
        raise RenderError(
            "the agent name (x-agl-agent, else model) must be at most 255 printable characters"
        )
    return Ask(rollout=rollout, agent=agent, api=api, body=request.state.body, charge=charge)


Serve = Callable[[Live | None], Coroutine[Any, Any, list[Completion]]]


async def _answer(request: Request, proxy: Proxy, req: wire.Request, serve: Serve) -> Response:
    """The reply to a model call that `serve` samples and records, in the request's wire format.
    Streamed if it asked: its text as it is sampled (one choice; several are streamed once all
    are recorded). A stream starts with the reply's first text, so an error before that is
    answered with its status, as an unstreamed call's is."""
    n = getattr(req, "n", 1)
    if not req.stream or n > 1:
        completions = await serve(None)
        reply = req.reply(completions)
        if not req.stream:
            return Response(orjson.dumps(reply), media_type="application/json")
        events = _replayed(req.streamer(), reply, completions[0].prompt_tokens)
    else:
        live = Live()
        serving = asyncio.create_task(serve(live))
        # its end ends the parts
        serving.add_done_callback(lambda _: live.parts.put_nowait(None))
        try:
            first = await _next_part(live, serving)
        except BaseException:
            serving.cancel()
            raise
        if first is None:  # recorded without text shown: a retry's reply, or only a tool call
            completions = serving.result()
            reply = req.reply(completions)
            events = _replayed(req.streamer(), reply, completions[0].prompt_tokens)
        else:
            events = _streamed(request, proxy, req, live, serving, first)
    headers = {"Cache-Control": "no-cache"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def _replayed(stream: wire.Stream, reply: JSON, prompt_tokens: int) -> AsyncIterator[str]:
    """A recorded reply as a stream."""
    for event in stream.opening(prompt_tokens):
        yield event
    for event in stream.closing(reply, {}):
        yield event


async def _streamed(
    request: Request,
    proxy: Proxy,
    req: wire.Request,
    live: Live,
    serving: "asyncio.Task[list[Completion]]",
    first: Part,
) -> AsyncIterator[str]:
    """A reply's stream while `serving` samples and records it: its parts as they come, and
    once it is recorded, the rest. An error ends it with the format's error event. A client that
    goes away cancels `serving`: the engine aborts the generation, and nothing is recorded."""
    stream = req.streamer()
    shown: dict[str, list[str]] = {REASONING: [], CONTENT: []}
    try:
        for event in stream.opening(live.prompt_tokens):
            yield event
        part: Part | None = first
        while part is not None:
            shown[part.kind].append(part.text)
            for event in stream.delta(part):
                yield event
            part = await _next_part(live, serving)
        reply = req.reply(await serving)
    except Exception as e:  # noqa: BLE001 - answered in the stream, as app.py answers the rest
        answer = await errors.report(proxy, request, e)
        for event in stream.error(answer.message, answer.kind, answer.code):
            yield event
        return
    finally:
        serving.cancel()  # a no-op once it has ended
    for event in stream.closing(reply, {kind: "".join(texts) for kind, texts in shown.items()}):
        yield event


async def _next_part(live: Live, serving: "asyncio.Task[list[Completion]]") -> Part | None:
    """The reply's next part, or None once `serving` has ended without one (raises what it
    raised)."""
    part = await live.parts.get()
    if part is None:
        serving.result()
    return part


ModelCall = Callable[[Request], Awaitable[Response]]


def model_calls(proxy: Proxy, auth: Auth) -> dict[str, ModelCall]:
    """The model calls by path, each with a live rollout's agent token; every reply is recorded
    first. `Admission` (gateway/app.py) serves them itself, ahead of FastAPI's routing."""

    def chat(
        api: str, schema: type[wire.ChatRequest | wire.ResponsesRequest | wire.AnthropicRequest]
    ) -> ModelCall:
        async def call(request: Request) -> Response:
            rollout = await auth.agent(request)
            charge = await proxy.charge(rollout, len(await request.body()))
            req = await body(request, schema)
            messages, tools, params = req.parse(proxy.renderer.thinking_switch)
            asked = _ask(request, rollout, api, req, charge)

            async def serve(live: Live | None) -> list[Completion]:
                return await proxy.chat(asked, messages, tools, params, live)

            return await _answer(request, proxy, req, serve)

        return call

    async def completions(request: Request) -> Response:
        rollout = await auth.agent(request)
        charge = await proxy.charge(rollout, len(await request.body()))
        req = await body(request, wire.CompletionRequest)
        if isinstance(req.prompt, str):
            ids = await asyncio.to_thread(proxy.renderer.encode, req.prompt)
        else:
            ids = req.prompt
        asked = _ask(request, rollout, "completions", req, charge)
        params = req.params()

        async def serve(live: Live | None) -> list[Completion]:
            return await proxy.complete(asked, ids, params, live)

        return await _answer(request, proxy, req, serve)

    return {
        "/v1/chat/completions": chat("chat", wire.ChatRequest),
        "/v1/responses": chat("responses", wire.ResponsesRequest),
        "/v1/messages": chat("messages", wire.AnthropicRequest),
        "/v1/completions": completions,
    }


def model_routes(calls: dict[str, ModelCall]) -> APIRouter:
    """The model calls as FastAPI's routes, for its OpenAPI schema: `Admission` serves their
    requests before FastAPI's routing would."""
    router = APIRouter()
    for path, call in calls.items():
        router.post(path)(call)
    return router


def harness_routes(auth: Auth) -> APIRouter:
    """The harness's other route, the model list, with a live rollout's agent token."""
    router = APIRouter()
    Agent = Annotated[Rollout, Depends(auth.agent)]

    @router.get("/v1/models")
    async def models(_: Agent) -> Any:
        card = {"id": "agl", "object": "model", "created": 0, "owned_by": "agl"}
        return {"object": "list", "data": [card]}

    return router


# ---------------------------------------------------------------------------- a rollout's own


def rollout_routes(proxy: Proxy, auth: Auth) -> APIRouter:
    """What a rollout's own tokens reach, besides the admin: its records, events, reward and end."""
    router = APIRouter()
    _add_records(router, proxy.store, auth)
    _add_reports(router, proxy, auth)
    return router


def _add_records(router: APIRouter, store: Store, auth: Auth) -> None:
    """A rollout's records: the rollout, its calls and its events."""
    Scoped = Annotated[Rollout, Depends(auth.rollout)]

    @router.get("/api/rollouts/{rollout_id}")
    async def get_rollout(rollout: Scoped) -> Any:
        # not the cached copy: rewards, calls
        return _jsonable(await asyncio.to_thread(store.get_rollout, rollout.id))

    @router.get("/api/rollouts/{rollout_id}/calls")
    async def get_calls(rollout: Scoped, all_attempts: bool = False) -> Any:
        found: dict[str, list[Call]] = await asyncio.to_thread(
            store.calls_for, [rollout.id], all_attempts=all_attempts
        )
        return [_jsonable(c) for c in found[rollout.id]]

    @router.get("/api/rollouts/{rollout_id}/events")
    async def get_events(rollout: Scoped, after: Cursor = 0) -> Any:
        events = await asyncio.to_thread(store.events, rollout.id, after=after)
        return [_jsonable(e) for e in events]


def _add_reports(router: APIRouter, proxy: Proxy, auth: Auth) -> None:
    """What a rollout's harness and grader post: events, its reward, its start and its end."""
    store = proxy.store
    Scoped = Annotated[Rollout, Depends(auth.rollout)]
    Rewarded = Annotated[Rollout, Depends(auth.reward)]

    @router.post("/api/rollouts/{rollout_id}/events")
    async def post_event(request: Request, rollout: Scoped) -> Any:
        poster = caller_of(request)
        charge = None
        if poster.role is not Role.ADMIN:
            charge = await proxy.charge(rollout, len(await request.body()))
        req = await body(request, EventIn)
        if not may_post(poster, rollout, req.kind):
            raise AuthError(
                403, f"events of kind {req.kind!r} cannot be posted with the {poster.credential}"
            )
        posted = store.append_event(rollout.id, req.kind, req.data, charge=charge)
        event = _jsonable(await wrap_future(posted))
        # not echoed back: it can be megabytes
        return {k: v for k, v in event.items() if k != "data"}

    @router.post("/api/rollouts/{rollout_id}/reward")
    async def post_reward(request: Request, rollout: Rewarded) -> Any:
        req = await body(request, RewardIn)
        source = req.source or caller_of(request).credential
        done = store.set_reward(
            rollout.id, req.reward, source=source, final=req.final, call_seq=req.call_seq
        )
        return _jsonable(await wrap_future(done))

    @router.post("/api/rollouts/{rollout_id}/status")
    async def post_status(request: Request, rollout: Rewarded) -> Any:
        """Moves the rollout, as far as the caller may (`may_move`)."""
        req = await body(request, StatusIn)
        poster = caller_of(request)
        if not may_move(poster, req.status):
            raise AuthError(
                403, f"the {poster.credential} cannot move its rollout to {req.status.value}"
            )
        try:
            done = store.transition(rollout.id, req.status, **req.model_dump(exclude={"status"}))
            rollout = await wrap_future(done)
        finally:
            auth.tokens.changed(rollout.id)
        proxy.moved(rollout)
        return _jsonable(rollout)


# ---------------------------------------------------------------------------- the admin API


def _credentials(settings: GatewaySettings, auth: Auth, created: Created) -> JSON:
    """What a launcher needs to run an attempt: the tokens (now known to the cache) and where
    harnesses call."""
    auth.tokens.issued(created)
    public = (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
    out = {
        "id": created.rollout.id,
        "attempt": created.rollout.attempt,
        "agent_token": created.agent_token,
        "base_url": public + "/v1",
        "anthropic_base_url": public,
    }
    if created.grader_token:
        out["grader_token"] = created.grader_token
    return out


def _metadata(req: RolloutIn) -> JSON:
    """A new rollout's metadata: the request's, with its grader and sampling."""
    metadata = dict(req.metadata)
    if req.grader not in (None, False):
        metadata["grader"] = req.grader
    if req.sampling and (sampling := req.sampling.model_dump(exclude_none=True)):
        metadata["sampling"] = sampling
    return metadata


def admin_routes(
    settings: GatewaySettings, store: Store, proxy: Proxy, replicas: Replicas, auth: Auth
) -> APIRouter:
    """The admin API: rollouts, and the model served; the admin key is checked where the router is
    mounted (`gateway/app.py`)."""
    router = APIRouter()
    _add_rollouts_admin(router, settings, store, auth)
    _add_serving_admin(router, store, proxy, replicas)
    return router


def _add_rollouts_admin(
    router: APIRouter, settings: GatewaySettings, store: Store, auth: Auth
) -> None:
    """Creating rollouts, new tokens for an attempt, and listing rollouts."""

    @router.post("/api/rollouts")
    async def create_rollout(request: Request) -> Any:
        req = await body(request, RolloutIn)
        made = store.create_rollout(
            req.task,
            req.group,
            req.mode,
            grader=bool(req.grader),
            metadata=_metadata(req),
            token_ttl_s=req.token_ttl_s or settings.token_ttl_s,
        )
        return _credentials(settings, auth, await wrap_future(made))

    @router.post("/api/rollouts/{rollout_id}/tokens")
    async def rotate_tokens(rollout_id: str, attempt: int | None = None) -> Any:
        try:
            made = store.rotate_tokens(
                rollout_id, attempt=attempt, token_ttl_s=settings.token_ttl_s
            )
            created = await wrap_future(made)
        finally:
            auth.tokens.changed(rollout_id)  # the old tokens are dead
        # new ones for a launcher, as a create gives
        return _credentials(settings, auth, created)

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


def _add_serving_admin(router: APIRouter, store: Store, proxy: Proxy, replicas: Replicas) -> None:
    """The model versions, and pausing and resuming the calls around a weight update."""

    @router.post("/api/models")
    async def register_model(request: Request) -> Any:
        req = await body(request, ModelIn)
        return _jsonable(await wrap_future(store.register_model(ModelVersion(**req.model_dump()))))

    @router.post("/api/pause")
    async def pause() -> Any:
        drained_s = await replicas.pause()  # every replica's calls
        return {"drained_s": round(drained_s, 4)} | proxy.state()

    @router.post("/api/resume")
    async def resume(request: Request) -> Any:
        req = await body_or_defaults(request, ResumeIn)
        await replicas.resume(req.version)
        return proxy.state()

    @router.get("/api/state")
    async def state() -> Any:
        latest = await asyncio.to_thread(store.latest_model)
        last_end = await asyncio.to_thread(store.last_end)
        model = None
        if latest:
            model = _jsonable(latest)
        return proxy.state() | {"latest_model": model, "last_end": last_end}


def open_routes(store: Store, proxy: Proxy, replicas: Replicas) -> APIRouter:
    """`/healthz` and `/metrics`, without credentials."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> Any:
        # A controller learns of restarts; a load balancer takes a replica that cannot reach the
        # store out of rotation.
        health = {"ok": not replicas.problem, "started_at": proxy.started}
        health |= proxy.state() | replicas.state()
        if replicas.problem:
            return JSONResponse(health, status_code=503)
        return health

    @router.get("/metrics")
    async def metrics() -> Response:
        for status, count in (await asyncio.to_thread(store.status_counts)).items():
            proxy.metrics.rollouts.labels(status).set(count)
        exposition = generate_latest(proxy.metrics.registry)
        return Response(exposition, media_type="text/plain; version=0.0.4")

    return router
