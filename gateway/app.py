"""`agl gateway`: the HTTP face of the gateway (FastAPI), for harnesses and for the admin API.

Owns: authentication (a rollout's agent token as `Authorization: Bearer`, `x-api-key` or the
`/r/{token}` path prefix; the grader token; the admin key on `/api`), the routes of DESIGN.md
section 3 and issue #4, the request size limit, and the mapping of every error to a status
code in the caller's wire format (Anthropic's on `/v1/messages`, OpenAI's elsewhere), never a
500 for bad input. A call with bad input leaves only an error event on its rollout.

It does not sample or record (`gateway/proxy.py`), parse wire formats (`gateway/wire.py`) or
render templates (`gateway/render.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hmac
import json
import logging
import time
from asyncio import wrap_future
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any

import orjson
import uvicorn
import uvloop
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.requests import ClientDisconnect

from agl.settings import from_flags, problems, usage_error
from agl.store import Created, IllegalTransition, InvalidData, NotFound, Store, StoreError, hash_token, token_expired
from agl.types import JSON, Call, Event, Mode, ModelVersion, Rollout, Status
from gateway import wire
from gateway.engines import EngineClient, EngineError, EngineRejected, EngineUnavailable
from gateway.proxy import ContextOverflow, HeldTooLong, Proxy
from gateway.render import Renderer, RenderError

log = logging.getLogger(__name__)
Cursor = Annotated[int, Query(ge=0, le=2**63 - 1)]  # compared in SQL: a larger one overflows the driver
ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class GatewaySettings(BaseSettings):
    """The gateway (`AGL_GATEWAY_*`); command-line flags override them."""

    model_config = SettingsConfigDict(env_prefix="AGL_GATEWAY_", extra="forbid")

    host: str = Field("127.0.0.1", description="Interface to listen on. Loopback by default: expose it on purpose.")
    port: int = Field(8000, description="TCP port.")
    admin_key: str = Field("", description="Key for /api (required). Harness tokens never reach /api's admin routes.")
    engine_urls: list[str] = Field(["http://127.0.0.1:30000"], description="Engine replicas (sglang or agl engine).")
    engine_timeout_s: float = Field(600.0, gt=0, description="Longest engine request (s), then retried.")
    tokenizer: str = Field("", description="Tokenizer folder; default: the engine's /model_info tokenizer_path.")
    public_url: str = Field("", description="URL harnesses reach the gateway at; default http://host:port.")
    max_body_bytes: int = Field(32 * 2**20, description="Largest request body (bytes). 32 MiB fits any real context.")
    token_ttl_s: float = Field(7 * 86400, ge=0, description="Tokens expire this long after issue (s); 0: never.")
    max_hold_s: float = Field(600.0, description="Longest a call waits during a pause before a 503 (seconds).")
    context_length: int = Field(0, description="Context window (tokens); 0: the engine's max_context_length.")
    default_max_tokens: int = Field(4096, description="Completion budget when a request gives none (tokens).")
    prefix_preserving: bool = Field(True, description="Reuse sampled IDs of earlier replies (DESIGN.md section 4).")
    tool_parser: str = Field("hermes", description="Tool-call format of the model family (gateway/render.py).")


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Admission:
    """ASGI middleware: moves `/r/{token}/...` tokens into the scope, enforces the body limit,
    and serves the harness's model calls itself: FastAPI's routing and dependency machinery
    cost ~300 us of a call's critical path (measured in bench/gateway.py); the routes stay
    registered with FastAPI for its OpenAPI schema."""

    def __init__(self, app: FastAPI, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.calls: dict[str, Callable[[Request], Awaitable[Response]]] = app.state.calls
        self.on_error: Callable[[Request, Exception], Awaitable[Response]] = app.state.on_error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        if path.startswith("/r/"):
            _, _, token, rest = path.split("/", 3) if path.count("/") >= 3 else (*path.split("/"), "")
            path = "/" + rest
            scope = scope | {"path": path, "raw_path": path.encode(), "agl_path_token": token}
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await _too_large(path, self.max_body_bytes)({"type": "http"}, None, send)  # type: ignore[arg-type]
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise _BodyTooLarge  # answered by the app's handler (create_app), or below
            return message

        call = self.calls.get(path) if scope["method"] == "POST" else None
        if call is None:
            return await self.app(scope, limited, send)
        request = Request(scope, limited)
        try:
            response = await call(request)
        except _BodyTooLarge:
            response = _too_large(path, self.max_body_bytes)
        except Exception as e:  # noqa: BLE001 - answered in the caller's wire format, as FastAPI's handlers do
            response = await self.on_error(request, e)
        await response(scope, limited, send)


class _BodyTooLarge(Exception):
    pass


def _too_large(path: str, limit: int) -> JSONResponse:
    message = f"request body is larger than the limit of {limit} bytes"
    kind = "request_too_large" if "/messages" in path else "invalid_request_error"
    return JSONResponse(_error_body(path, message, kind), status_code=413)


def _error_body(path: str, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSON:
    if path.endswith("/v1/messages") or path == "/v1/messages":
        return wire.anthropic_error(message, kind)
    return wire.openai_error(message, kind, code)


def _jsonable(record: Any) -> JSON:
    out = dataclasses.asdict(record)
    for key in ("prompt_ids", "response_ids", "logprobs"):
        if key in out:
            out[key] = out[key].tolist()
    return out


class SamplingIn(BaseModel):
    """Sampling the gateway applies to every call of a rollout, whatever the harness asks (e.g. greedy validation)."""

    model_config = ConfigDict(extra="forbid")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)


class RolloutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: JSON = Field(default_factory=dict)
    group: str = Field(min_length=1, max_length=255)
    mode: Mode = Mode.TRAIN
    grader: Any = None
    sampling: SamplingIn | None = None
    metadata: JSON = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _no_sampling(cls, metadata: JSON) -> JSON:
        if "sampling" in metadata:
            raise ValueError("`sampling` is set through the request's own `sampling` field")
        return metadata


class StatusIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Status
    failure_kind: str | None = None
    reason: str = ""
    attempt: int | None = None


class RewardIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float = Field(allow_inf_nan=False)
    final: bool = True
    call_seq: int | None = None
    source: str = ""


class EventIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str = Field(min_length=1, max_length=32)
    data: JSON = Field(default_factory=dict)


class ModelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=0, le=2**31 - 1)  # an INTEGER column
    path: str = ""
    endpoints: list[str] = Field(default_factory=list)
    metadata: JSON = Field(default_factory=dict)


class ResumeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int | None = Field(None, ge=0)


def create_app(settings: GatewaySettings, store: Store, proxy: Proxy) -> FastAPI:
    """The gateway's ASGI app over an open store and a ready proxy."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await proxy.engines.aclose()

    app = FastAPI(title="agl gateway", version="0.1", lifespan=lifespan)
    started_at = time.time()  # in /healthz: a controller learns that the gateway restarted during a run

    # ------------------------------------------------------------------ auth

    def presented(request: Request) -> str:
        token = request.scope.get("agl_path_token") or request.headers.get("x-api-key", "")
        auth = request.headers.get("authorization", "")
        if not token and auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        return str(token)

    def is_admin(request: Request) -> bool:
        return bool(settings.admin_key) and hmac.compare_digest(presented(request), settings.admin_key)

    # Token hash -> (rollout, role). This gateway is the store's only writer, so it keeps the
    # entries current: it updates them with every status change it makes and caches the tokens
    # it issues. A read that was under way during a change is not cached (`epoch`).
    tokens: OrderedDict[str, tuple[Rollout, str]] = OrderedDict()
    hashes: dict[str, set[str]] = {}  # rollout id -> its cached token hashes
    epoch = 0  # counts changes

    async def lookup(token: str) -> tuple[Rollout, str] | None:
        """The rollout and role of a token."""
        if token_expired(token):
            raise AuthError(401, "this token has expired; a launcher gets new ones from /api/rollouts/{id}/tokens")
        digest = hash_token(token)
        if digest in tokens:
            return tokens[digest]
        seen = epoch
        found = await asyncio.to_thread(store.rollout_for_token, token)
        if found is not None and epoch == seen:
            cache(digest, found)
        return found

    def cache(digest: str, found: tuple[Rollout, str]) -> None:
        tokens[digest] = found
        hashes.setdefault(found[0].id, set()).add(digest)
        while len(tokens) > 100_000:
            old, (rollout, _) = tokens.popitem(last=False)
            hashes.get(rollout.id, set()).discard(old)

    def changed(rollout_id: str, now: Rollout | None = None) -> None:
        """A rollout changed: its entries get its new state, or are dropped when it is not known."""
        nonlocal epoch
        epoch += 1
        for digest in list(hashes.get(rollout_id, ())):
            if now is not None and digest in tokens:
                tokens[digest] = (now, tokens[digest][1])
            else:
                tokens.pop(digest, None)
                hashes[rollout_id].discard(digest)

    def issued(created: Created) -> None:
        """Tokens this gateway just handed out: known without a read on their first call."""
        cache(hash_token(created.agent_token), (created.rollout, "agent"))
        if created.grader_token:
            cache(hash_token(created.grader_token), (created.rollout, "grader"))

    async def harness(request: Request) -> Rollout:
        token = presented(request)
        if not token:
            raise AuthError(401, "missing API key: use the rollout's agent token")
        found = await lookup(token)
        if found is None:
            raise AuthError(401, "invalid API key")
        rollout, role = found
        request.state.rollout = rollout
        if role != "agent":
            raise AuthError(403, "the grader token cannot call the model")
        if rollout.status.terminal:
            raise AuthError(403, f"rollout {rollout.id} has ended ({rollout.status.value})")
        if rollout.status is Status.QUEUED:
            try:
                rollout = await wrap_future(store.transition(rollout.id, Status.RUNNING, reason="first model call"))
            except IllegalTransition:  # started (or ended) by someone else meanwhile
                changed(rollout.id)
                rollout = await asyncio.to_thread(store.get_rollout, rollout.id)
                if rollout.status.terminal:
                    raise AuthError(403, f"rollout {rollout.id} has ended ({rollout.status.value})") from None
                return rollout
            changed(rollout.id, rollout)
        return rollout

    def admin(request: Request) -> None:
        if not is_admin(request):
            raise AuthError(401 if not presented(request) else 403, "the admin key is required")

    async def scoped(request: Request, rollout_id: str, *, reward: bool = False) -> Rollout:
        """The admin, or a token of this very rollout (for rewards: the grader's, or the agent's
        when the rollout has no grader)."""
        if is_admin(request):
            return await asyncio.to_thread(store.get_rollout, rollout_id)
        found = await lookup(presented(request)) if presented(request) else None
        if found is None:
            raise AuthError(401, "the admin key or this rollout's token is required")
        rollout, role = found
        if rollout.id != rollout_id:
            raise AuthError(403, "this token belongs to another rollout")
        if reward and role == "agent" and rollout.has_grader:
            raise AuthError(403, "this rollout has a grader: only the grader token may post its reward")
        if rollout.status.terminal:
            raise AuthError(403, f"rollout {rollout.id} has ended ({rollout.status.value})")
        return rollout

    async def body(request: Request, schema: type[Any]) -> Any:
        data = await request.body()
        try:
            raw = orjson.loads(data)  # a quarter of the standard library's time on a harness's body
        except orjson.JSONDecodeError:
            try:  # what only the standard library takes: NaN, integers beyond 64 bits
                raw = json.loads(data)
                json.dumps(raw, ensure_ascii=False).encode()  # and lone surrogates, which no tokenizer takes
            except ValueError as e:
                raise RenderError(f"the request body is not valid JSON: {e}") from e
        if not isinstance(raw, dict):
            raise RenderError("the request body must be a JSON object")
        request.state.body = raw
        return schema.model_validate(raw)

    # ------------------------------------------------------------------ errors

    async def reply_error(request: Request, status: int, message: str, kind: str, code: str | None = None) -> Response:
        rollout = getattr(request.state, "rollout", None)
        if rollout is not None and request.url.path.startswith("/v1"):
            try:
                await wrap_future(
                    store.append_event(rollout.id, "error", {"status": status, "message": message[:2000]})
                )
            except StoreError:
                log.warning("rollout_id=%s: could not record an error event", rollout.id)
        headers = {"Retry-After": "5"} if status == 503 else None
        return JSONResponse(_error_body(request.url.path, message, kind, code), status_code=status, headers=headers)

    async def on_error(request: Request, e: Exception) -> Response:
        if isinstance(e, AuthError):
            kind = "authentication_error" if e.status == 401 else "permission_error"
            return await reply_error(request, e.status, str(e), kind)
        if isinstance(e, ContextOverflow):
            return await reply_error(request, 400, str(e), "invalid_request_error", "context_length_exceeded")
        if isinstance(e, RenderError | InvalidData | IllegalTransition) or (
            isinstance(e, EngineRejected) and e.status < 500
        ):
            status = 409 if isinstance(e, IllegalTransition) else 400
            return await reply_error(request, status, str(e), "invalid_request_error")
        if isinstance(e, ValidationError):
            return await reply_error(request, 400, f"invalid request: {problems(e)}", "invalid_request_error")
        if isinstance(e, NotFound):
            return await reply_error(request, 404, str(e), "not_found_error")
        if isinstance(e, HeldTooLong | EngineUnavailable):
            return await reply_error(
                request, 503, str(e), "overloaded_error" if "messages" in request.url.path else "server_error"
            )
        if isinstance(e, EngineError | StoreError):
            log.error("request %s failed: %s", request.url.path, e)
            return await reply_error(request, 502, f"upstream failure: {e}", "api_error")
        if isinstance(e, ClientDisconnect):
            return Response(status_code=499)  # nobody is listening; nothing was recorded
        log.exception("unexpected error on %s", request.url.path)
        return await reply_error(request, 500, "internal error", "api_error")

    for expected in (AuthError, RenderError, StoreError, EngineError, HeldTooLong, ValidationError, Exception):
        app.add_exception_handler(expected, on_error)

    @app.exception_handler(_BodyTooLarge)
    async def on_too_large(request: Request, _: Exception) -> Response:
        return _too_large(request.url.path, settings.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, e: RequestValidationError) -> Response:
        return await reply_error(request, 400, f"invalid request: {e.errors()}", "invalid_request_error")

    # ------------------------------------------------------------------ harness-facing

    def agent_of(request: Request, model: str) -> str:
        return request.headers.get("x-agl-agent") or model or "default"

    def reply(response: JSON, chunks: Iterator[str] | None = None) -> Response:
        """The reply as one JSON body, or as server-sent events when the client asked to stream."""
        if chunks is not None:
            return StreamingResponse(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return Response(orjson.dumps(response), media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        rollout = await harness(request)
        req = await body(request, wire.ChatRequest)
        messages, tools, params = req.parse()
        agent = agent_of(request, req.model)
        completions = await proxy.chat(rollout, agent, "chat", messages, tools, params, req.n, request.state.body)
        response = wire.chat_response(completions, req.model, req.logprobs)
        usage = bool((req.stream_options or {}).get("include_usage"))
        return reply(response, wire.chat_stream(response, usage) if req.stream else None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        rollout = await harness(request)
        req = await body(request, wire.CompletionRequest)
        ids = proxy.renderer.encode(req.prompt) if isinstance(req.prompt, str) else list(req.prompt)
        agent = agent_of(request, req.model)
        done = await proxy.complete(rollout, agent, ids, req.params(), req.n, request.state.body)
        response = wire.completion_response(done, req.model)
        return reply(response, wire.completion_stream(response) if req.stream else None)

    async def single(request: Request, schema: Any, api: str, to_wire: Any, to_stream: Any) -> Response:
        """A one-choice API (Responses, Anthropic Messages): parse, serve, answer in its format."""
        rollout = await harness(request)
        req = await body(request, schema)
        messages, tools, params = req.parse()
        agent = agent_of(request, req.model)
        (done,) = await proxy.chat(rollout, agent, api, messages, tools, params, 1, request.state.body)
        response = to_wire(done, req.model)
        return reply(response, to_stream(response) if req.stream else None)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await single(request, wire.ResponsesRequest, "responses", wire.responses_response, wire.responses_stream)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await single(request, wire.AnthropicRequest, "messages", wire.anthropic_response, wire.anthropic_stream)

    app.state.on_error = on_error
    app.state.calls = {
        "/v1/chat/completions": chat_completions,
        "/v1/completions": completions,
        "/v1/responses": responses,
        "/v1/messages": messages,
    }

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        await harness(request)
        return {"object": "list", "data": [{"id": "agl", "object": "model", "created": 0, "owned_by": "agl"}]}

    # ------------------------------------------------------------------ admin API

    def credentials(created: Created) -> JSON:
        """What a launcher needs to run an attempt: the tokens and where harnesses call."""
        public = (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")
        out = {"id": created.rollout.id, "attempt": created.rollout.attempt, "agent_token": created.agent_token}
        out |= {"base_url": public + "/v1", "anthropic_base_url": public}
        return out | ({"grader_token": created.grader_token} if created.grader_token else {})

    @app.post("/api/rollouts")
    async def create_rollout(request: Request) -> Any:
        admin(request)
        req = await body(request, RolloutIn)
        metadata = req.metadata | ({"grader": req.grader} if req.grader not in (None, False) else {})
        if req.sampling and (sampling := req.sampling.model_dump(exclude_none=True)):
            metadata["sampling"] = sampling
        created = await wrap_future(
            store.create_rollout(
                req.task,
                req.group,
                req.mode,
                grader=bool(req.grader),
                metadata=metadata,
                token_ttl_s=settings.token_ttl_s,
            )
        )
        issued(created)
        return credentials(created)

    @app.post("/api/rollouts/{rollout_id}/tokens")
    async def rotate_tokens(request: Request, rollout_id: str, attempt: int | None = None) -> Any:
        """New credentials for a launcher (the old tokens die): same reply shape as a create."""
        admin(request)
        try:
            created = await wrap_future(
                store.rotate_tokens(rollout_id, attempt=attempt, token_ttl_s=settings.token_ttl_s)
            )
        finally:
            changed(rollout_id)  # the old tokens are dead
        issued(created)
        return credentials(created)

    @app.get("/api/rollouts")
    async def list_rollouts(
        request: Request,
        status: Status | None = None,
        group: str | None = None,
        after: Cursor | None = None,
        limit: int = 100,
        offset: Cursor = 0,
    ) -> Any:
        admin(request)
        limit = max(1, min(limit, 10_000))
        if after is not None:
            found = await asyncio.to_thread(store.terminal_after, after, limit)
        else:
            found = await asyncio.to_thread(store.list_rollouts, status=status, group=group, limit=limit, offset=offset)
        return [_jsonable(r) for r in found]

    @app.get("/api/rollouts/{rollout_id}")
    async def get_rollout(request: Request, rollout_id: str) -> Any:
        await scoped(request, rollout_id)
        return _jsonable(await asyncio.to_thread(store.get_rollout, rollout_id))  # not the cached copy: rewards, calls

    @app.get("/api/rollouts/{rollout_id}/calls")
    async def get_calls(request: Request, rollout_id: str, all_attempts: bool = False) -> Any:
        await scoped(request, rollout_id)
        found: dict[str, list[Call]] = await asyncio.to_thread(store.calls_for, [rollout_id], all_attempts=all_attempts)
        return [_jsonable(c) for c in found[rollout_id]]

    @app.get("/api/rollouts/{rollout_id}/events")
    async def get_events(request: Request, rollout_id: str, after: Cursor = 0) -> Any:
        await scoped(request, rollout_id)
        found: list[Event] = await asyncio.to_thread(store.events, rollout_id, after=after)
        return [_jsonable(e) for e in found]

    @app.post("/api/rollouts/{rollout_id}/events")
    async def post_event(request: Request, rollout_id: str) -> Any:
        await scoped(request, rollout_id)
        req = await body(request, EventIn)
        return _jsonable(await wrap_future(store.append_event(rollout_id, req.kind, req.data)))

    @app.post("/api/rollouts/{rollout_id}/reward")
    async def post_reward(request: Request, rollout_id: str) -> Any:
        await scoped(request, rollout_id, reward=True)
        req = await body(request, RewardIn)
        source = req.source or ("admin" if is_admin(request) else "rollout token")
        event = await wrap_future(
            store.set_reward(rollout_id, req.reward, source=source, final=req.final, call_seq=req.call_seq)
        )
        return _jsonable(event)

    @app.post("/api/rollouts/{rollout_id}/status")
    async def post_status(request: Request, rollout_id: str) -> Any:
        admin(request)
        req = await body(request, StatusIn)
        try:
            rollout = await wrap_future(
                store.transition(
                    rollout_id, req.status, failure_kind=req.failure_kind, reason=req.reason, attempt=req.attempt
                )
            )
        except StoreError:
            changed(rollout_id)
            raise
        changed(rollout_id, rollout)
        if rollout.status.terminal or rollout.status is Status.QUEUED:
            proxy.renderer.forget(rollout_id)
            proxy.seen.discard(rollout_id)
        return _jsonable(rollout)

    @app.post("/api/models")
    async def register_model(request: Request) -> Any:
        admin(request)
        req = await body(request, ModelIn)
        return _jsonable(
            await wrap_future(store.register_model(ModelVersion(req.version, req.path, req.endpoints, req.metadata)))
        )

    @app.post("/api/pause")
    async def pause(request: Request) -> Any:
        admin(request)
        drained_s = await proxy.pause()
        return {"drained_s": round(drained_s, 4)} | proxy.state()

    @app.post("/api/resume")
    async def resume(request: Request) -> Any:
        admin(request)
        req = await body(request, ResumeIn) if await request.body() else ResumeIn()
        proxy.resume(req.version)
        return proxy.state()

    @app.get("/api/state")
    async def state(request: Request) -> Any:
        admin(request)
        latest = await asyncio.to_thread(store.latest_model)
        return proxy.state() | {"latest_model": _jsonable(latest) if latest else None}

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True, "started_at": started_at} | proxy.state()

    @app.get("/metrics")
    async def metrics() -> Response:
        for status, count in (await asyncio.to_thread(store.status_counts)).items():
            proxy.metrics.rollouts.labels(status).set(count)
        return Response(generate_latest(proxy.metrics.registry), media_type="text/plain; version=0.0.4")

    return app


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


async def engine_info(engines: EngineClient, wait_s: float = 600) -> JSON:
    """The engine's /model_info, waiting for it to come up."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            return await engines.model_info()
        except EngineError as e:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.info("waiting for the engine: %s", e)
            await asyncio.sleep(1)


def make_app(
    settings: GatewaySettings, store: Store, engines: EngineClient, info: JSON, tokenizer: Any = None
) -> ASGIApp:
    """The gateway over an open store and engine client, given the engine's /model_info."""
    tokenizer = tokenizer or load_tokenizer(settings.tokenizer or info["tokenizer_path"])
    latest = store.latest_model()
    if not settings.context_length and "max_context_length" not in info:
        log.warning("the engine reports no context length: assuming 32768 (set AGL_GATEWAY_CONTEXT_LENGTH)")
    proxy = Proxy(
        store,
        engines,
        Renderer(tokenizer, tool_parser=settings.tool_parser),
        context_length=settings.context_length or int(info.get("max_context_length", 32768)),
        default_max_tokens=settings.default_max_tokens,
        max_hold_s=settings.max_hold_s,
        prefix_preserving=settings.prefix_preserving,
        version=latest.version if latest else 0,
    )
    return _Admission(create_app(settings, store, proxy), settings.max_body_bytes)


def main(argv: list[str]) -> int:
    settings, args = from_flags(
        GatewaySettings,
        argv,
        "agl gateway",
        __doc__.split("\n")[0],
        aliases={"engine_urls": "--engine-url"},
        extra=lambda p: p.add_argument("--db", help="store URL (default: AGL_STORE_URL or sqlite:///agl.db)"),
    )
    if not settings.admin_key:
        usage_error("agl gateway", "an admin key is required: --admin-key or AGL_GATEWAY_ADMIN_KEY")
    store = Store(args.db)

    async def serve() -> None:
        async with EngineClient(settings.engine_urls, timeout_s=settings.engine_timeout_s) as engines:
            app = make_app(settings, store, engines, await engine_info(engines))
            gc.collect()  # the start-up heap (tokenizer, transformers: ~400k objects) lives as long as
            gc.freeze()  # the process: kept out of every later collection (4-10% more calls/s, measured)
            config = uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                log_level="warning",
                access_log=False,
                timeout_keep_alive=120,
            )
            log.info("gateway on http://%s:%d, engines %s", settings.host, settings.port, settings.engine_urls)
            await uvicorn.Server(config).serve()

    try:
        uvloop.run(serve())
    finally:
        store.close()
    return 0
