"""`agl gateway`: the HTTP face of the gateway (FastAPI), for harnesses and for the admin API.

Owns the app's assembly from `gateway/routes.py`'s routers (each mounted with its auth), the
`/r/{token}` path prefix, the body size limit, and answering every error with a status in the
caller's wire format (Anthropic's on `/v1/messages`, else OpenAI's), never a 500 for bad input;
a model call with bad input leaves only an error event. It does not sample, record, parse or render.
"""

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import uvicorn
import uvloop
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agl.settings import from_flags, problems, usage_error
from agl.store import IllegalTransition, InvalidData, NotFound, Store, StoreError
from gateway import wire
from gateway.auth import Auth, AuthError
from gateway.engines import (
    EngineAborted,
    EngineClient,
    EngineError,
    EngineInfo,
    EngineRejected,
    EngineUnavailable,
)
from gateway.proxy import HeldTooLong, Proxy
from gateway.render import Renderer
from gateway.routes import admin_routes, harness_routes, open_routes, rollout_routes
from gateway.settings import GatewaySettings
from gateway.types import ContextOverflow, RenderError, TooLarge

log = logging.getLogger(__name__)
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class Admission:
    """ASGI middleware: moves a `/r/{token}/...` path's token into the scope (for `gateway/auth.py`), refuses
    NUL in paths and bodies over the limit (the declared length or the bytes as they arrive), answers every error
    with `on_error` and keeps the connection (Starlette's handler of Exception answers, then re-raises: uvicorn
    drops it), and writes the access log."""

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, on_error: ErrorHandler, access_log: bool = False
    ) -> None:
        self.app, self.max_body_bytes, self.on_error, self.access_log = (
            app,
            max_body_bytes,
            on_error,
            access_log,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        if path.startswith("/r/"):
            token, _, rest = path[3:].partition("/")
            path = "/" + rest
            scope = {**scope, "path": path, "raw_path": path.encode(), "agl_path_token": token}
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise TooLarge(
                    f"request body is larger than the limit of {self.max_body_bytes} bytes"
                )
            return message

        status, started = 0, time.monotonic()

        async def sending(message: Message) -> None:
            nonlocal status
            status = message["status"] if message["type"] == "http.response.start" else status
            await send(message)

        try:
            if "\x00" in path or b"%00" in scope.get(
                "query_string", b""
            ):  # IDs and names are text columns
                raise RenderError("NUL characters are not allowed in paths or queries")
            length = dict(scope.get("headers") or []).get(b"content-length", b"0")
            if length.isdigit() and int(length) > self.max_body_bytes:
                raise TooLarge(
                    f"request body is larger than the limit of {self.max_body_bytes} bytes"
                )
            await self.app(scope, limited, sending)
        except Exception as e:  # every error, refusals and bugs alike
            if status:
                raise  # the reply had begun: nothing left to answer with
            await (await self.on_error(Request(scope), e))(scope, receive, sending)
        finally:
            if self.access_log:  # the path without a /r/{token} prefix, and no query: never a token
                rollout = getattr(scope.get("state", {}).get("rollout"), "id", "-")
                ms = (time.monotonic() - started) * 1000
                log.info(
                    "%s %s %d %.1f ms rollout_id=%s", scope["method"], path, status, ms, rollout
                )


class Bounded(HttpToolsProtocol):
    """uvicorn's HTTP protocol with the bounds it lacks: a request's head (request line and headers) arrives
    within `head_timeout_s` of its first byte, or of the connection's opening, and is at most `max_head_bytes`;
    else the connection closes (after a 400 for the size). Slow or huge heads would hold connections and memory."""

    max_head_bytes, head_timeout_s = 64 * 1024, 30.0
    timer: asyncio.TimerHandle | None = None  # armed while a head is awaited

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timer, self.head = self.loop.call_later(self.head_timeout_s, self.transport.close), 0

    def data_received(self, data: bytes) -> None:
        if self.timer is None and (
            self.cycle is None or self.cycle.response_complete
        ):  # a new request begins
            self.timer, self.head = (
                self.loop.call_later(self.head_timeout_s, self.transport.close),
                0,
            )
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


def _answer(e: Exception, path: str) -> tuple[int, str, str, str | None]:
    """How an error is answered: status, message, error type and (OpenAI's) error code."""
    anthropic = path.endswith("/v1/messages")
    busy = "overloaded_error" if anthropic else "server_error"  # a temporary failure: retry
    match e:
        case AuthError():
            return (
                e.status,
                str(e),
                "authentication_error" if e.status == 401 else "permission_error",
                None,
            )
        case ContextOverflow():
            return 400, str(e), "invalid_request_error", "context_length_exceeded"
        case TooLarge():
            return 413, str(e), "request_too_large" if anthropic else "invalid_request_error", None
        case IllegalTransition():
            return 409, str(e), "invalid_request_error", None
        case RenderError() | InvalidData() | EngineRejected():
            return 400, str(e), "invalid_request_error", None
        case ValidationError():
            return 400, f"invalid request: {problems(e)}", "invalid_request_error", None
        case RequestValidationError():
            return 400, f"invalid request: {e.errors()}", "invalid_request_error", None
        case NotFound():
            return 404, str(e), "not_found_error", None
        case HeldTooLong():
            return 503, str(e), busy, None
        case EngineAborted():  # nothing was recorded: a retry samples afresh
            log.warning("request %s: %s", path, e)
            return 503, "the model engine aborted the generation; retry the call", busy, None
        case EngineUnavailable():  # the details (engine addresses) go to the log, not to harnesses
            log.error("request %s failed: %s", path, e)
            return 503, "the model engine is unavailable; retry shortly", busy, None
        case EngineError() | StoreError():
            log.error("request %s failed: %s", path, e)
            return 502, "upstream failure (the gateway's log has the details)", "api_error", None
    log.exception("unexpected error on %s", path, exc_info=e)
    return 500, "internal error", "api_error", None


def make_app(
    settings: GatewaySettings, store: Store, engines: EngineClient, info: EngineInfo
) -> FastAPI:
    """The gateway's ASGI app over an open store and engine client, given what the engine says of itself."""
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
        honours_seed = (
            info.owned_by == "agl"
        )  # the embedded engine; sglang only with settings it cannot report
    proxy = Proxy(store, engines, renderer, settings, honours_seed=honours_seed)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with engines:  # closed when the app stops
            yield

    app = FastAPI(title="agl gateway", version="0.1", lifespan=lifespan)
    auth = Auth(settings.admin_key, store)
    app.include_router(harness_routes(proxy, auth))
    app.include_router(
        admin_routes(settings, store, proxy, auth), dependencies=[Depends(auth.admin)]
    )
    app.include_router(rollout_routes(proxy, auth))
    app.include_router(open_routes(store, proxy))

    async def on_error(request: Request, e: Exception) -> Response:
        if isinstance(e, ClientDisconnect):
            return Response(status_code=499)  # nobody is listening; nothing was recorded
        path = request.url.path
        status, message, kind, code = _answer(e, path)
        if path.startswith("/v1/"):
            proxy.metrics.errors.labels(str(status), kind).inc()
        rollout = getattr(request.state, "rollout", None)  # set on model calls by `Auth.agent`
        if rollout is not None:
            try:
                event = {"status": status, "message": message[:2000]}
                await asyncio.wrap_future(store.append_event(rollout.id, "error", event))
            except StoreError:
                log.warning("rollout_id=%s: could not record an error event", rollout.id)
        body = wire.error(message, kind, code, anthropic=path.endswith("/v1/messages"))
        return JSONResponse(
            body, status_code=status, headers={"Retry-After": "5"} if status == 503 else None
        )

    app.add_exception_handler(
        RequestValidationError, on_error
    )  # instead of FastAPI's 422; the rest: `Admission`
    app.add_middleware(Admission, settings.max_body_bytes, on_error, settings.access_log)
    return app


async def engine_info(engines: EngineClient, wait_s: float = 600) -> EngineInfo:
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
            gc.collect()  # the start-up heap (tokenizer, transformers: ~400k objects) lives as long as
            gc.freeze()  # the process: kept out of every later collection (4-10% more calls/s, measured)
            Bounded.max_head_bytes, Bounded.head_timeout_s = (
                settings.max_head_bytes,
                settings.head_timeout_s,
            )
            config = uvicorn.Config(
                app,
                settings.host,
                settings.port,
                log_level="warning",
                access_log=False,
                http=Bounded,
            )
            config.limit_concurrency, config.timeout_keep_alive = (
                settings.max_connections,
                120,
            )  # idle harnesses (s)
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
