"""`agl gateway`: the HTTP face of the gateway (FastAPI), for harnesses and for the admin API.

Owns the app's assembly from `gateway/routes.py`'s routers (each mounted with its auth), the
`/r/{token}` path prefix, the body size limit, and answering every error with a status in the
caller's wire format (Anthropic's on `/v1/messages`, else OpenAI's; `gateway/errors.py` says
which status and message), never a 500 for bad input; a model call with bad input leaves only an
error event. It does not sample, record, parse or render.
"""

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

import uvicorn
import uvloop
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agl.settings import from_flags, usage_error
from agl.store import (
    Store,
)
from gateway import errors, wire
from gateway.auth import Auth
from gateway.engine_replies import EngineError, EngineInfo
from gateway.engines import EngineClient, Room
from gateway.fleet import Replicas
from gateway.proxy import Proxy
from gateway.render import Renderer
from gateway.routes import (
    ModelCall,
    admin_routes,
    harness_routes,
    model_calls,
    model_routes,
    open_routes,
    rollout_routes,
)
from gateway.settings import GatewaySettings
from gateway.types import Peers, RenderError, TooLarge

log = logging.getLogger(__name__)
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class Admission:
    """ASGI middleware: moves a `/r/{token}/...` path's token into the scope (for
    `gateway/auth.py`), refuses NUL in paths and bodies over the limit (the declared length or the
    bytes as they arrive), serves the model calls (`calls`, by path) itself, answers every error
    with `on_error` and keeps the connection (Starlette's handler of Exception answers, then
    re-raises: uvicorn drops it), and writes the access log. FastAPI's routing, dependency solving
    and middleware cost a model call 2-5% of its CPU one at a time and 8-14% at 64 clients
    (bench.gateway_ab, 2026-12-07); every other route is FastAPI's."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        on_error: ErrorHandler,
        calls: dict[str, ModelCall],
        access_log: bool = False,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.on_error = on_error
        self.calls = calls
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = _without_path_token(scope)
        path: str = scope["path"]
        reply = _Reply(send)
        started = time.monotonic()
        try:
            self._check(scope)
            limited = self._limited(receive)
            call = self.calls.get(path) if scope["method"] == "POST" else None
            if call is None:
                await self.app(scope, limited, reply.send)
            else:
                response = await call(Request(scope, limited))
                await response(scope, limited, reply.send)
        except Exception as e:  # every error, refusals and bugs alike
            if reply.status:
                raise  # the reply had begun: nothing left to answer with
            await (await self.on_error(Request(scope), e))(scope, receive, reply.send)
        finally:
            if self.access_log:
                _log_access(scope, path, reply.status, started)

    def _check(self, scope: Scope) -> None:
        """Refuses NUL in the path or query (IDs and names are text columns), and a body whose
        declared length is over the limit."""
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            raise RenderError("NUL characters are not allowed in paths or queries")
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise self._too_large()

    def _limited(self, receive: Receive) -> Receive:
        """`receive`, refusing the body once the bytes that arrived pass the limit."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise self._too_large()
            return message

        return limited

    def _too_large(self) -> TooLarge:
        return TooLarge(f"request body is larger than the limit of {self.max_body_bytes} bytes")


class _Reply:
    """`send`, noting the reply's status once it begins (0 before)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 0

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)


def _without_path_token(scope: Scope) -> Scope:
    """The scope of a `/r/{token}/...` request with the token moved from its path to
    `agl_path_token`; any other scope as it is."""
    path: str = scope["path"]
    if not path.startswith("/r/"):
        return scope
    token, _, rest = path[3:].partition("/")
    path = "/" + rest
    return {**scope, "path": path, "raw_path": path.encode(), "agl_path_token": token}


def _log_access(scope: Scope, path: str, status: int, started: float) -> None:
    """One line per request: `path` is without a /r/{token} prefix, and no query: never a token."""
    rollout = getattr(scope.get("state", {}).get("rollout"), "id", "-")
    ms = (time.monotonic() - started) * 1000
    log.info("%s %s %d %.1f ms rollout_id=%s", scope["method"], path, status, ms, rollout)


class Bounded(HttpToolsProtocol):
    """uvicorn's HTTP protocol with the bounds it lacks: a request's head (request line and
    headers) arrives within `head_timeout_s` of its first byte, or of the connection's opening,
    and is at most `max_head_bytes`; else the connection closes (after a 400 for the size). Slow
    or huge heads would hold connections and memory."""

    max_head_bytes = 64 * 1024
    head_timeout_s = 30.0
    timer: asyncio.TimerHandle | None = None  # armed while a head is awaited

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        # a new request begins
        if self.timer is None and (self.cycle is None or self.cycle.response_complete):
            self._await_head()
        super().data_received(data)
        self.head += len(data)
        if self.timer is not None and self.head > self.max_head_bytes:
            self.send_400_response(
                f"the request's line and headers exceed {self.max_head_bytes} bytes"
            )

    def on_headers_complete(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        super().on_headers_complete()

    def _await_head(self) -> None:
        """Arms the timer of a request's head, and counts its bytes from none."""
        self.timer = self.loop.call_later(self.head_timeout_s, self.transport.close)
        self.head = 0


# ---------------------------------------------------------------------------- errors


def _error_handler(proxy: Proxy, store: Store) -> ErrorHandler:
    """Answers every error in the caller's wire format (`_answer`), counts those of model calls,
    and records a model call's as an event of its rollout."""

    async def on_error(request: Request, e: Exception) -> Response:
        if isinstance(e, ClientDisconnect):
            return Response(status_code=499)  # nobody is listening; nothing was recorded
        path = request.url.path
        answer = await errors.report(proxy, request, e)
        anthropic = path.endswith("/v1/messages")
        body = wire.error(answer.message, answer.kind, answer.code, anthropic=anthropic)
        headers = None
        if answer.status == 503:
            headers = {"Retry-After": "5"}
        return JSONResponse(body, status_code=answer.status, headers=headers)

    return on_error


# ---------------------------------------------------------------------------- the app


def _proxy(
    settings: GatewaySettings, store: Store, engines: EngineClient, info: EngineInfo, peers: Peers
) -> Proxy:
    """The recording path over an open store and engine client, given what the engine says of
    itself; `peers`: the count of the other live gateways, which the fleet keeps."""
    from transformers import AutoTokenizer  # slow to import: only where a tokenizer is loaded

    tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer or info.tokenizer_path)
    context_length = settings.context_length or info.context_length
    if not context_length:
        log.warning(
            "the engine reports no context length: assuming 32768 (set AGL_GATEWAY_CONTEXT_LENGTH)"
        )
        context_length = 32768
    renderer = Renderer(tokenizer, tool_parser=settings.tool_parser, context_length=context_length)
    honours_seed = settings.seed_honoured
    if honours_seed is None:
        # the embedded engine; sglang only with settings it cannot report
        honours_seed = info.owned_by == "agl"
    return Proxy(
        store,
        engines,
        renderer,
        settings,
        room=Room(context_length=context_length, pool_tokens=info.pool_tokens),
        honours_seed=honours_seed,
        parse_request=partial(wire.parse_recorded, thinking_switch=renderer.thinking_switch),
        peers=peers,
    )


def make_app(
    settings: GatewaySettings, store: Store, engines: EngineClient, info: EngineInfo
) -> FastAPI:
    """The gateway's ASGI app over an open store and engine client, given what the engine says of
    itself."""
    peers = Peers()  # counted by `replicas`, read by `proxy`
    proxy = _proxy(settings, store, engines, info, peers)
    replicas = Replicas(store, proxy, peers, address=f"{settings.host}:{settings.port}")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with engines:  # closed when the app stops
            await replicas.join()
            try:
                yield
            finally:
                await replicas.leave()

    app = FastAPI(title="agl gateway", version="0.1", lifespan=lifespan)
    auth = Auth(settings.admin_key, store)
    calls = model_calls(proxy, auth)
    app.include_router(model_routes(calls))
    app.include_router(harness_routes(auth))
    app.include_router(
        admin_routes(settings, store, proxy, replicas, auth), dependencies=[Depends(auth.admin)]
    )
    app.include_router(rollout_routes(proxy, auth))
    app.include_router(open_routes(store, proxy, replicas))
    on_error = _error_handler(proxy, store)
    # instead of FastAPI's 422; the rest: `Admission`
    app.add_exception_handler(RequestValidationError, on_error)
    app.add_middleware(
        Admission,
        max_body_bytes=settings.max_body_bytes,
        on_error=on_error,
        calls=calls,
        access_log=settings.access_log,
    )
    return app


async def engine_info(engines: EngineClient, wait_s: float = 600) -> EngineInfo:
    """What the engine says of itself, once it answers (waiting up to `wait_s` for it)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            return await engines.model_info()
        except EngineError as e:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.info("waiting for the engine: %s", e)
            await asyncio.sleep(1)


def main(argv: list[str]) -> int:
    settings = from_flags(GatewaySettings, argv, "agl gateway")
    if not settings.admin_key:
        usage_error("agl gateway", "an admin key is required: --admin-key or AGL_GATEWAY_ADMIN_KEY")
    store = Store(settings.db)

    async def serve() -> None:
        client = EngineClient(
            settings.engine_url, timeout_s=settings.engine_timeout_s, api_key=settings.engine_key
        )
        async with client as engines:
            app = make_app(settings, store, engines, await engine_info(engines))
            # The start-up heap (tokenizer, transformers: ~400k objects) lives as long as the
            # process: kept out of every later collection (4-10% more calls/s, measured).
            gc.collect()
            gc.freeze()
            Bounded.max_head_bytes = settings.max_head_bytes
            Bounded.head_timeout_s = settings.head_timeout_s
            config = uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                log_level="warning",
                access_log=False,
                http=Bounded,
                limit_concurrency=settings.max_connections,
                timeout_keep_alive=120,  # idle harnesses (s)
            )
            log.info(
                "gateway on http://%s:%d, engines %s",
                settings.host,
                settings.port,
                settings.engine_url,
            )
            await uvicorn.Server(config).serve()

    try:
        uvloop.run(serve())
    finally:
        store.close()
    return 0
