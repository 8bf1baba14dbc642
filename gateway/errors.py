"""How the gateway answers an error: a refusal (the client's fault) with its own message and
status, a failure (upstream, or a bug) logged and told in general terms; and a model call's error
counted and recorded as an event of its rollout. The answer's wire format is the caller's
(`gateway/wire/`); `gateway/app.py` answers with a status, a stream with its format's error
event (`gateway/routes.py`).
"""

import asyncio
import logging
from dataclasses import dataclass

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agl.settings import problems
from agl.store import (
    IllegalTransition,
    InvalidData,
    NotFound,
    OverBudget,
    StoreError,
    StoreUnavailable,
)
from gateway.auth import AuthError
from gateway.engine_replies import EngineAborted, EngineError, EngineRejected, EngineUnavailable
from gateway.gate import HeldTooLong
from gateway.proxy import Proxy
from gateway.types import ContextOverflow, RenderError, TooLarge

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """How an error is answered: status, message, error type and (OpenAI's) error code."""

    status: int
    message: str
    kind: str
    code: str | None = None


# Refusals answered with their own message, by the first row whose types match: (types, status,
# error type, OpenAI's error code). A ContextOverflow is a RenderError with a code of its own.
REFUSALS: list[tuple[tuple[type[Exception], ...], int, str, str | None]] = [
    ((ContextOverflow,), 400, "invalid_request_error", "context_length_exceeded"),
    ((RenderError, InvalidData, EngineRejected), 400, "invalid_request_error", None),
    ((IllegalTransition,), 409, "invalid_request_error", None),
    ((NotFound,), 404, "not_found_error", None),
]


def answer(e: Exception, path: str) -> Answer:
    """How an error is answered: a refusal (the client's fault) with its own message, a failure
    (upstream, or a bug) logged and told in general terms."""
    anthropic = path.endswith("/v1/messages")
    if isinstance(e, AuthError):
        if e.status == 401:
            return Answer(status=e.status, message=str(e), kind="authentication_error")
        return Answer(status=e.status, message=str(e), kind="permission_error")
    if isinstance(e, TooLarge | OverBudget):
        kind = "request_too_large" if anthropic else "invalid_request_error"
        return Answer(status=413, message=str(e), kind=kind)
    for types, status, kind, code in REFUSALS:
        if isinstance(e, types):
            return Answer(status=status, message=str(e), kind=kind, code=code)
    if isinstance(e, ValidationError):
        message = f"invalid request: {problems(e)}"
        return Answer(status=400, message=message, kind="invalid_request_error")
    if isinstance(e, RequestValidationError):
        message = f"invalid request: {e.errors()}"
        return Answer(status=400, message=message, kind="invalid_request_error")
    return _failure(e, path, anthropic=anthropic)


def _failure(e: Exception, path: str, *, anthropic: bool) -> Answer:
    """A failure that is not the client's: a temporary one (503: retry) or not."""
    busy = "overloaded_error" if anthropic else "server_error"
    if isinstance(e, HeldTooLong):
        return Answer(status=503, message=str(e), kind=busy)
    if isinstance(e, EngineAborted):
        # nothing was recorded: a retry samples afresh
        log.warning("request %s: %s", path, e)
        message = "the model engine aborted the generation; retry the call"
        return Answer(status=503, message=message, kind=busy)
    if isinstance(e, EngineUnavailable):
        # the details (engine addresses) go to the log, not to harnesses
        log.error("request %s failed: %s", path, e)
        message = "the model engine is unavailable; retry shortly"
        return Answer(status=503, message=message, kind=busy)
    if isinstance(e, StoreUnavailable):
        log.error("request %s failed: %s", path, e)
        message = "the gateway's store is unavailable; retry shortly"
        return Answer(status=503, message=message, kind=busy)
    if isinstance(e, EngineError | StoreError):
        log.error("request %s failed: %s", path, e)
        message = "upstream failure (the gateway's log has the details)"
        return Answer(status=502, message=message, kind="api_error")
    log.exception("unexpected error on %s", path, exc_info=e)
    return Answer(status=500, message="internal error", kind="api_error")


async def report(proxy: Proxy, request: Request, e: Exception) -> Answer:
    """The answer to `e`, counted if `request` is a model call, and recorded as an error event of
    its rollout (if it has one)."""
    path = request.url.path
    found = answer(e, path)
    if path.startswith("/v1/"):
        proxy.metrics.errors.labels(str(found.status), found.kind).inc()
    # set on model calls by `Auth.agent`
    rollout = getattr(request.state, "rollout", None)
    if rollout is not None:
        try:
            event = {"status": found.status, "message": found.message[:2000]}
            await asyncio.wrap_future(proxy.store.append_event(rollout.id, "error", event))
        except StoreError:
            log.warning("rollout_id=%s: could not record an error event", rollout.id)
    return found
