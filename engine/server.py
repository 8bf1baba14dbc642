"""`agl engine`: the embedded CPU engine's HTTP server, speaking sglang's HTTP API.

The subset it speaks is in docs/architecture.md, "Engines".

Owns request validation (the requests' wire format, sglang's, is `requests.py`'s; the replies',
`stream.py`'s) and the mapping of engine failures to status codes: malformed or impossible requests
get 400 with `{"error": {"message": ...}}` and the server keeps serving; `/generate` while the
memory is released gets 503 (a temporary state, as for an sglang server that is asleep). `"stream":
true` answers with sglang's event stream (`stream.py`; `--incremental-streaming-output` as
sglang's). A client that disconnects aborts its request, and so does `/abort_request` (by rid, as
sglang's). A prompt sglang's scheduler would refuse (`max_req_input_len` tokens or more) is refused
as sglang refuses it: a 400, or streamed, a 200 whose one chunk is a 400 abort. `/v1/loads` counts
the requests running and waiting, as sglang's. With `--api-key`, every route but `/health` needs
`Authorization: Bearer <key>` (a 401 without it), as sglang's `--api-key` does.
`--script FILE` (a JSON list of completion texts) is a test facility: see `batcher.py`. It does not
batch or sample (that is `batcher.py`) nor know model names (that is `models.py`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, CliImplicitFlag, SettingsConfigDict

from agl.settings import from_flags, problems, usage_error
from engine import models
from engine.batcher import Engine, EngineReleased, Job, Result, ScriptExhausted
from engine.requests import (
    AbortRequest,
    GenerateRequest,
    UpdateWeightsRequest,
    WeightVersionRequest,
)
from engine.stream import DISCONNECT_POLL_S, refusal, reply, stream

M = TypeVar("M", bound=BaseModel)
VERSION = version("agl")  # what `/v1/loads` reports, where sglang reports its own version


class EngineSettings(BaseSettings):
    """The embedded engine (`AGL_ENGINE_*`); command-line flags override them."""

    model_config = SettingsConfigDict(env_prefix="AGL_ENGINE_", extra="forbid")

    model: str = Field("tiny", description="tiny | smollm2 | a Hugging Face model folder.")
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(30000, description="TCP port (sglang's default).")
    api_key: str = Field(
        "", description="Key every route but /health requires (Bearer), as sglang's --api-key."
    )
    script: Path | None = Field(
        None, description="Test facility: a JSON list of completion texts to answer with."
    )
    weight_version: str = Field("0", description="Weight version reported until the first update.")
    cache_dir: Path = Field(
        default=Path("~/.cache/agl/models").expanduser(),
        description="Folder where built models (`tiny`, converted `smollm2`) are kept (path). "
        "Built once, then reused, so a restart costs no rebuild.",
    )
    threads: int = Field(
        default=1,
        ge=1,
        description="torch intra-op threads of the model thread (count). 1 keeps shared CI "
        "machines fair; batching, not threads, is what makes the engine fast.",
    )
    max_batch: int = Field(
        default=16,
        ge=1,
        description="Requests decoded together (count). 16 covers the concurrent rollouts one CPU "
        "engine can serve; more only grows the KV cache.",
    )
    incremental_streaming_output: CliImplicitFlag[bool] = Field(
        default=False,
        description="Streamed /generate chunks carry only the new tokens and text (with "
        "completion_tokens still the total), as sglang's --incremental-streaming-output; off: "
        "each chunk carries everything so far, as sglang's default.",
    )
    prefix_cache_tokens: int = Field(
        default=8192,
        ge=0,
        description="Tokens of finished requests whose keys and values are kept for prompts that "
        "start with them (count; 0: off). SmolLM2-135M keeps 46 KiB per token.",
    )


class BadRequest(Exception):
    """A malformed or impossible request: answered 400, and the server keeps serving."""


def error(status: int, message: str) -> JSONResponse:
    """An error reply in sglang's shape."""
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def parse(request: Request, schema: type[M]) -> M:
    """The request's JSON body (an empty body is `{}`), validated by `schema`."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
        return schema.model_validate(body)
    except json.JSONDecodeError as e:
        raise BadRequest(f"malformed JSON: {e}") from e
    except ValidationError as e:
        raise BadRequest(problems(e)) from e


def check_vocabulary(req: GenerateRequest, vocab_size: int) -> None:
    """Every prompt and stop token is a token of the model."""
    ids = [*req.input_ids, *req.sampling_params.stop_token_ids]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")


def check_context(req: GenerateRequest, max_context: int) -> None:
    """The prompt and the longest completion asked for fit in the model's context."""
    prompt = len(req.input_ids)
    max_new_tokens = req.sampling_params.max_new_tokens
    if prompt + max_new_tokens > max_context:
        raise BadRequest(
            f"{prompt} prompt tokens + max_new_tokens {max_new_tokens} exceed the "
            f"context of {max_context} tokens"
        )


def too_long(req: GenerateRequest, max_input_tokens: int) -> str | None:
    """sglang's refusal of a prompt of `max_req_input_len` tokens or more (managers/utils.py
    `validate_input_length`, without --allow-auto-truncate), or None if the prompt is shorter."""
    n = len(req.input_ids)
    if n < max_input_tokens:
        return None
    return (
        f"Input length ({n} tokens) exceeds the maximum allowed length ({max_input_tokens} "
        "tokens). Use a shorter input or enable --allow-auto-truncate."
    )


async def outcome(job: Job, request: Request) -> Result | None:
    """The job's result once it finishes, or None if its client goes first (the job is then
    cancelled). Raises what the job failed with."""
    waiter = asyncio.wrap_future(job.future)
    while not waiter.done():
        await asyncio.wait({waiter}, timeout=DISCONNECT_POLL_S)
        if not waiter.done() and await request.is_disconnected():
            job.cancelled = True
            return None
    return waiter.result()


async def answer(engine: Engine, req: GenerateRequest, request: Request) -> Response:
    """The whole reply once the job ends (499 if the client goes first)."""
    start = time.monotonic()
    job = engine.submit(req.input_ids, req.sampling_params.sampling(), rid=req.rid)
    result = await outcome(job, request)
    if result is None:
        return Response(status_code=499)
    return JSONResponse(reply(engine, req, result, time.monotonic() - start))


def generation_routes(engine: Engine, incremental: bool = False) -> APIRouter:
    """`/generate`: a request checked, queued for the model thread and answered when it ends, or
    streamed as it is sampled (`stream.py`; only the new tokens in each chunk when `incremental`);
    `/abort_request`: requests ended early, as sglang's."""
    router = APIRouter()

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        req = await parse(request, GenerateRequest)
        check_vocabulary(req, engine.vocab_size)
        check_context(req, engine.max_context)
        refused = too_long(req, engine.max_input_tokens)
        if refused is not None and req.stream:
            return refusal(engine, req, refused)
        if refused is not None:
            return error(400, refused)
        try:
            if req.stream:
                return await stream(engine, req, request, incremental)
            return await answer(engine, req, request)
        except EngineReleased as e:
            return error(503, str(e))
        except ScriptExhausted as e:
            return error(400, str(e))

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        """As sglang's: a 200 with an empty body, whether or not a request had the rid (`Engine.abort`
        says which requests end, and how)."""
        req = await parse(request, AbortRequest)
        engine.abort(req.rid or "", req.abort_all)
        return Response()

    return router


def memory_routes(engine: Engine) -> APIRouter:
    """Memory, weights and cache, as sglang's: each runs once no request is in flight."""
    router = APIRouter()

    @router.post("/release_memory_occupation")
    async def release() -> dict[str, Any]:
        await asyncio.wrap_future(engine.release())
        return {"success": True}

    @router.post("/resume_memory_occupation")
    async def resume() -> dict[str, Any]:
        await asyncio.wrap_future(engine.resume())
        return {"success": True}

    @router.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Response:
        req = await parse(request, UpdateWeightsRequest)
        try:
            await asyncio.wrap_future(engine.update_weights(req.model_path, req.weight_version))
        except (OSError, ValueError) as e:
            message = f"failed to load {req.model_path}: {e}"
            return JSONResponse({"success": False, "message": message}, 400)
        return JSONResponse(
            {"success": True, "message": "weights updated", "num_paused_requests": 0}
        )

    @router.post("/update_weight_version")
    async def update_weight_version(request: Request) -> dict[str, Any]:
        """As sglang's: names the weights served, without loading any (no request may be in flight)."""
        req = await parse(request, WeightVersionRequest)
        await asyncio.wrap_future(engine.set_weight_version(req.new_version))
        message = f"Weight version updated to {req.new_version}"
        return {"success": True, "message": message, "new_version": req.new_version}

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        await asyncio.wrap_future(engine.command(engine.prefixes.clear))
        return Response("Cache flushed.\n")

    return router


def load(engine: Engine) -> dict[str, Any]:
    """The engine's entry of sglang's `/v1/loads` (`LoadSnapshot.to_dict` with `include=core`).

    - `num_running_reqs` and `num_waiting_reqs` are never both 0 while a request is in flight
      (`Engine.load`), so a trainer may poll them for an idle engine;
    - `num_used_tokens`: the running requests' prompt and sampled tokens; `num_total_tokens` adds the
      waiting prompts; `num_waiting_uncached_tokens`: the waiting prompts (the engine looks for
      cached prefixes only when it admits a request, as sglang without its waiting-queue match);
    - `max_total_num_tokens`: `max_batch` rows of the whole context; `token_usage` the used share;
    - `cache_hit_rate`: prompt tokens found in the prefix cache, of all admitted since the start
      (sglang's is over its recent prefills);
    - `gen_throughput` and `utilization` are 0.0: the engine measures neither (sglang 0.5.13's
      `utilization` is 0 too unless `max_running_requests_under_SLO` is set).
    """
    now = engine.load()
    used = now.used_tokens
    prefilled = engine.stats["prefilled_tokens"]
    return {
        "dp_rank": 0,
        "num_running_reqs": now.running,
        "num_waiting_reqs": now.waiting,
        "num_waiting_uncached_tokens": now.waiting_tokens,
        "num_used_tokens": used,
        "num_total_tokens": used + now.waiting_tokens,
        "max_total_num_tokens": engine.max_total_tokens,
        "max_running_requests": engine.max_batch,
        "token_usage": round(used / engine.max_total_tokens, 4),
        "gen_throughput": 0.0,
        "cache_hit_rate": round(engine.stats["cached_tokens"] / max(prefilled, 1), 4),
        "utilization": 0.0,
    }


def info_routes(engine: Engine) -> APIRouter:
    """What the engine serves and how busy it is: `/model_info`, the OpenAI-style `/v1/models` and
    sglang's `/v1/loads`."""
    router = APIRouter()

    @router.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": engine.model_path,
            "tokenizer_path": engine.tokenizer_path,
            "is_generation": True,
            "weight_version": engine.weight_version,
            "vocab_size": engine.vocab_size,
            "eos_token_ids": sorted(engine.eos_ids),
            "released": engine.model is None,
        }

    @router.get("/v1/models")
    async def models_list() -> dict[str, Any]:
        """As sglang's: one model card, whose `max_model_len` is the context the engine serves
        (the gateway reads it there) and whose `owned_by` names the engine ("agl": it honours
        `sampling_seed`)."""
        card = {
            "id": engine.model_path,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "agl",
            "root": engine.model_path,
            "parent": None,
            "max_model_len": engine.max_context,
        }
        return {"object": "list", "data": [card]}

    @router.get("/v1/loads")
    async def loads() -> dict[str, Any]:
        """As sglang's, for its one data-parallel rank (no `include`, `dp_rank` or `format`)."""
        timestamp = datetime.now(UTC).isoformat()
        return {"timestamp": timestamp, "version": VERSION, "loads": [load(engine)]}

    return router


def health_routes() -> APIRouter:
    """`/health`, which needs no key."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        return Response()

    return router


def needs_key(api_key: str) -> Callable[[Request], Awaitable[None]]:
    """A dependency that refuses (401) a request without `Authorization: Bearer <api_key>`."""
    wanted = f"Bearer {api_key}".encode()

    async def keyed(request: Request) -> None:
        # as it came: bytes, not ASCII
        presented = request.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(presented, wanted):
            raise HTTPException(401, "this engine needs its API key: Authorization: Bearer <key>")

    return keyed


def create_app(engine: Engine, api_key: str = "", incremental: bool = False) -> FastAPI:
    """The engine's HTTP app; with an `api_key`, every route but `/health` needs it; streams send
    only the new tokens in each chunk when `incremental`."""
    app = FastAPI(title="agl embedded engine")
    keyed: list[Any] = []
    if api_key:
        keyed.append(Depends(needs_key(api_key)))
    app.include_router(generation_routes(engine, incremental), dependencies=keyed)
    app.include_router(memory_routes(engine), dependencies=keyed)
    app.include_router(info_routes(engine), dependencies=keyed)
    app.include_router(health_routes())

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, e: BadRequest) -> JSONResponse:
        return error(400, str(e))

    return app


def read_script(path: Path | None) -> list[str] | None:
    """The `--script` file's completion texts; a usage error unless it is a JSON list of strings."""
    if path is None:
        return None
    script = json.loads(path.read_text())
    if not (isinstance(script, list) and all(isinstance(s, str) for s in script)):
        usage_error("agl engine", "--script must name a JSON list of strings")
    return script


def main(argv: list[str]) -> int:
    args = from_flags(EngineSettings, argv, "agl engine")
    script = read_script(args.script)
    path = models.resolve(args.model, args.cache_dir)
    engine = Engine(
        path,
        max_batch=args.max_batch,
        threads=args.threads,
        prefix_cache_tokens=args.prefix_cache_tokens,
        script=script,
        weight_version=args.weight_version,
    )
    try:
        uvicorn.run(
            create_app(engine, args.api_key, args.incremental_streaming_output),
            host=args.host,
            port=args.port,
            ws="none",
            log_level="warning",
        )
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
