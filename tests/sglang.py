"""A scripted stand-in for an sglang 0.5.13 server as verl 0.9.1 launches it (`skip_tokenizer_init`).

sglang needs a GPU, so it cannot run here. This server answers the routes agl uses the way sglang's own
code does, read from its released wheel (`pip download --no-deps sglang==0.5.13`) and checked against
the replies of a real server on an H200 (`shared/evidence/sglang-0.5.13/probe-h200.json`); each
behaviour names the file it comes from, under `sglang/srt/`. What it samples is scripted (completion
texts, tokenized with the model's tokenizer and closed by the end-of-turn token), and its logprobs are
made-up but distinct values: agl must record what the engine sent, whatever it is.

It is deliberately unkind where sglang is:
- `/server_info` and `/get_server_info` answer 500, as on every server verl launches (verl's
  `async_sglang_server.py` stores sglang's `PortArgs` as `scheduler_info`, and `entrypoints/http_server.py`
  then fails to build `{**asdict(server_args), **scheduler_info}`);
- a generation decodes in the scheduler, apart from its HTTP request: a streamed request whose client
  left keeps decoding for 2 s, until `create_abort_task` aborts it, unless `/abort_request` names its
  `rid` first;
- `/release_memory_occupation` or a weight update while a request runs or waits kills the scheduler
  (`scheduler_components/weight_updater.py` asserts the server is idle): the server stops, and every
  later connection is refused;
- `/release_memory_occupation` and `/resume_memory_occupation` answer 200 with the body `null`;
  `/update_weights_from_disk` loads at once, even while the memory is released;
- sampling parameters sglang refuses are refused with its 400 and message; a prompt of
  `min(C - 1, pool - 1) - 5` tokens or more is aborted with status 400 (in a stream: a 200 whose chunk
  says so);
- an aborted request is a 200 whose `finish_reason` is `{"type": "abort", ...}`, with the partial
  output; one aborted in the waiting queue has sglang's `_handle_abort_req` chunk (`output_ids` only
  the last id);
- `"stream": true` answers with sglang's event stream: a chunk when the output reaches 1, 1 +
  `stream_interval`, 1 + 2 x `stream_interval` ... tokens (every token at 1), and the last; cumulative
  unless `incremental` (`--incremental-streaming-output`).
It does not batch, cache prefixes or coalesce chunks a slow client has not read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from transformers import AutoTokenizer

from tests.gateway.conftest import serve_server

VERSION = "0.5.13"
ABORT_GRACE_S = 2.0  # managers/tokenizer_manager.py `create_abort_task`: asyncio.sleep(2)
RESERVED_TOKENS = 5  # managers/tp_worker.py: max_req_input_len = max_req_len - 5
IDLE = "release_memory_occupation should be called only when server is idle."
FLUSH = "Cache flush failed after updating weights"  # weight_updater.py, after a weight update


@dataclasses.dataclass
class Reply:
    """One scripted completion: its text; after how many tokens it is aborted (as by a weight
    update's `abort_all_requests`), a ValueError stops it, or it is retracted to the waiting queue
    (as when the KV cache runs out; it waits there until aborted). None: never."""

    text: str
    abort_after: int | None = None
    fail_after: int | None = None
    retract_after: int | None = None


@dataclasses.dataclass
class Call:
    """One `/generate` in the scheduler: who asked, what is sampled so far, and the outputs the
    scheduler sent for its stream (managers/scheduler_components/output_streamer.py)."""

    rid: str
    prompt_tokens: int
    logprobs: bool  # return_logprob
    started: float  # time.monotonic()
    stream_interval: int
    output_ids: list[int] = dataclasses.field(default_factory=list)
    finish: dict[str, Any] | None = None
    error: str | None = None  # a ValueError's message: sent as the stream's error chunk
    to_abort: bool = False  # scheduler.py `abort_request`: ends at the next step
    ended_waiting: bool = False  # aborted in the waiting queue: answered by `_handle_abort_req`
    outputs: asyncio.Queue[int | None] = dataclasses.field(default_factory=asyncio.Queue)
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


@dataclasses.dataclass
class Log:
    """What the stand-in saw, for the tests to check."""

    requests: list[tuple[str, Any]] = dataclasses.field(default_factory=list)  # (path, JSON body)
    loaded_while_released: list[str] = dataclasses.field(default_factory=list)  # model paths
    generated_while_released: int = 0
    # time.monotonic() when each generation sampled its last token (finished by stop or length)
    finished_at: list[float] = dataclasses.field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


class SglangStandIn:
    """The state of one scripted sglang server; `served()` serves it, `app()` is its HTTP face."""

    def __init__(
        self,
        model_path: Path,
        script: list[str | Reply] | None = None,
        *,
        context_len: int = 2048,
        pool_tokens: int | None = None,
        token_delay_s: float = 0.0,
        launched_by_verl: bool = True,
        incremental: bool = False,
        stream_interval: int = 1,
        waiting_timeout_s: float | None = None,
    ) -> None:
        """`pool_tokens`: the KV cache's tokens (default 64 contexts); `stream_interval`,
        `incremental`: sglang's flags; `waiting_timeout_s`: SGLANG_REQ_WAITING_TIMEOUT (off)."""
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.script = [r if isinstance(r, Reply) else Reply(r) for r in script or []]
        self.context_len = context_len
        self.pool_tokens = pool_tokens or 64 * context_len
        self.vocab_size = len(self.tokenizer)
        self.token_delay_s = token_delay_s
        self.launched_by_verl = launched_by_verl
        self.incremental = incremental  # server_args.py: incremental_streaming_output
        self.stream_interval = stream_interval
        self.waiting_timeout_s = waiting_timeout_s
        self.weight_version = "default"  # server_args.py: ServerArgs.weight_version
        self.released = False
        self.running: dict[str, Call] = {}  # rid -> a call decoding
        self.waiting: dict[str, Call] = {}  # rid -> a call retracted to the waiting queue
        self.aborted: set[str] = set()  # rids aborted by /abort_request or a client that left
        self.died: str | None = None  # the assertion that killed the scheduler
        self.on_death: Callable[[], None] = lambda: None  # `served()` stops the server
        self.log = Log()

    @contextmanager
    def served(self) -> Iterator[str]:
        """The stand-in on 127.0.0.1 (its base URL); a scheduler's death stops the server, as
        sglang's `kill_process_tree` does, so later connections are refused."""
        with serve_server(self.app()) as (url, server):
            self.on_death = lambda: _kill(server)
            yield url

    # ------------------------------------------------------------------ limits

    @property
    def max_req_len(self) -> int:
        """managers/tp_worker.py: the longest request, prompt and output."""
        return min(self.context_len - 1, self.pool_tokens - 1)

    def check(self, input_ids: list[int], params: dict[str, Any]) -> str | None:
        """The message sglang's 400 carries for this request, or None: `sampling/sampling_params.py`
        (`SamplingParams.__init__` maps temperature 0 to greedy and top_k -1 to the whole vocabulary before
        `verify`) and `managers/tokenizer_manager.py` (`_validate_one_request`)."""
        temperature = params.get("temperature", 1.0)
        top_k = params.get("top_k", -1)
        top_p = params.get("top_p", 1.0)
        max_new_tokens = params.get("max_new_tokens", 128)
        if 0 <= temperature < 1e-6:
            top_k = 1
        if top_k == -1:
            top_k = 1 << 30
        if temperature < 0.0:
            return f"temperature must be non-negative, got {temperature}."
        if not 0.0 < top_p <= 1.0:
            return f"top_p must be in (0, 1], got {top_p}."
        if top_k < 1:
            return f"top_k must be -1 (disable) or at least 1, got {top_k}."
        if max_new_tokens is not None and max_new_tokens < 0:
            return f"max_new_tokens must be at least 0, got {max_new_tokens}."
        if len(input_ids) >= self.context_len:
            return (
                f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                f"({self.context_len} tokens)."
            )
        if max_new_tokens is not None and len(input_ids) + max_new_tokens > self.context_len:
            return (
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens. You requested a total of "
                f"{len(input_ids) + max_new_tokens} tokens: {len(input_ids)} tokens from the input "
                f"messages and {max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )
        return None

    def too_long(self, prompt_tokens: int) -> str | None:
        """The scheduler's refusal of a prompt at the edge of the context or the KV pool
        (managers/utils.py `validate_input_length`), or None."""
        limit = self.max_req_len - RESERVED_TOKENS
        if prompt_tokens < limit:
            return None
        return (
            f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length ({limit} "
            "tokens). Use a shorter input or enable --allow-auto-truncate."
        )

    def new_tokens(self, prompt_tokens: int, asked: int | None) -> int:
        """managers/scheduler.py `init_req_max_new_tokens`: what is asked, within the room left."""
        if asked is None:
            asked = 1 << 30
        room = self.max_req_len - prompt_tokens - 1
        pool_room = self.pool_tokens - prompt_tokens - 2  # page_size 1
        return max(0, min(asked, room, pool_room))

    # ------------------------------------------------------------------ generation

    async def generate(self, body: dict[str, Any], request: Request) -> Response:
        """`entrypoints/http_server.py` `generate_request`: 400 with `{"error": {"message"}}` for a
        refused request; else `{"output_ids", "meta_info"}` (no `text`: the tokenizer is skipped),
        or its event stream when `stream` is true. A streamed request is checked inside its
        stream (managers/tokenizer_manager.py `_validate_one_request` runs in the generator that
        `stream_results` iterates): refused, it is a 200 whose stream holds the error chunk."""
        input_ids = list(body.get("input_ids") or [])
        params = dict(body.get("sampling_params") or {})
        problem = self.check(input_ids, params)
        if problem is not None and body.get("stream"):
            refused = [_event({"error": _error_chunk(problem)}), b"data: [DONE]\n\n"]
            return StreamingResponse(iter(refused), media_type="text/event-stream")
        if problem is not None:
            return JSONResponse({"error": {"message": problem}}, status_code=400)
        if self.released:
            self.log.generated_while_released += 1
        call = Call(
            rid=body.get("rid") or uuid.uuid4().hex,
            prompt_tokens=len(input_ids),
            logprobs=bool(body.get("return_logprob")),
            started=time.monotonic(),
            stream_interval=params.get("stream_interval") or self.stream_interval,
        )
        self.start(call, params)
        if body.get("stream"):
            return StreamingResponse(
                self.stream(call),
                media_type="text/event-stream",
                background=BackgroundTask(self.abandon, call.rid),
            )
        return await self.answer(call, request)

    def start(self, call: Call, params: dict[str, Any]) -> None:
        """The call into the scheduler: aborted at once (400) if its prompt is too long, else
        decoded by a task of its own."""
        max_new_tokens = params.get("max_new_tokens", 128)
        self.running[call.rid] = call
        refusal = self.too_long(call.prompt_tokens)
        if refusal is not None:
            # managers/schedule_batch.py `set_finish_with_abort`: FINISH_ABORT with status 400
            finish = {"type": "abort", "status_code": 400, "err_type": "BadRequestError"}
            self.end(call, {**finish, "message": refusal})
            return
        reply = self.script.pop(0) if self.script else Reply("")
        limit = self.new_tokens(call.prompt_tokens, max_new_tokens)
        decoding = self.decode(call, reply, limit, ignore_eos=params.get("ignore_eos", False))
        asyncio.get_running_loop().create_task(decoding)

    async def decode(
        self, call: Call, reply: Reply, max_new_tokens: int, *, ignore_eos: bool = False
    ) -> None:
        """The scheduler's work on one call: the reply's tokens, one per `token_delay_s`, each
        streamed as the output streamer would (the last token's output is the finished one); ends
        by stop, length, abort or a ValueError (managers/schedule_batch.py FINISH_*). With
        `ignore_eos` the end-of-turn token ends nothing: the reply is sampled again after it."""
        wanted = [*self.tokenizer.encode(reply.text, add_special_tokens=False), self.end_id]
        if ignore_eos:
            wanted = wanted * (max_new_tokens // len(wanted) + 1)
        for token in wanted:
            made = len(call.output_ids)
            if made == max_new_tokens:
                self.end(call, {"type": "length", "length": max_new_tokens})
                return
            if call.to_abort or reply.abort_after == made:
                self.end(call, _aborted("Aborted"))  # FINISH_ABORT(): one more step, no token
                return
            if reply.fail_after == made:
                call.error = f"scripted failure after {reply.fail_after} tokens"
                self.end(call, None)
                return
            if reply.retract_after == made:
                self.retract(call)
                return
            await asyncio.sleep(self.token_delay_s)
            call.output_ids.append(token)
            if token == self.end_id and not ignore_eos:
                self.end(call, {"type": "stop", "matched": self.end_id})
                return
            if len(call.output_ids) < max_new_tokens and _streams_at(
                len(call.output_ids), call.stream_interval
            ):
                call.outputs.put_nowait(len(call.output_ids))

    def end(self, call: Call, finish: dict[str, Any] | None) -> None:
        """The call leaves the scheduler with `finish` (None: failed); its stream's last output."""
        call.finish = finish
        self.running.pop(call.rid, None)
        self.waiting.pop(call.rid, None)
        if finish is not None and finish["type"] in ("stop", "length"):
            self.log.finished_at.append(time.monotonic())
        call.outputs.put_nowait(None)
        call.done.set()

    def retract(self, call: Call) -> None:
        """The call back to the waiting queue, its output kept (managers/scheduler.py retracts
        decoding requests when the KV cache runs out); it waits there until aborted, or until
        `waiting_timeout_s` aborts it with a 503 (`_abort_on_waiting_timeout`)."""
        self.running.pop(call.rid, None)
        self.waiting[call.rid] = call
        if self.waiting_timeout_s is not None:
            message = "Request waiting timeout reached."
            timeout = {"type": "abort", "status_code": 503, "message": message}
            loop = asyncio.get_running_loop()
            loop.call_later(self.waiting_timeout_s, self.abort_waiting, call, timeout)

    def abort_waiting(self, call: Call, finish: dict[str, Any]) -> None:
        """A waiting call aborted: the tokenizer manager answers it as `_handle_abort_req` does."""
        if self.waiting.get(call.rid) is call:
            call.ended_waiting = True
            self.end(call, finish)

    def abort(self, rid: str) -> None:
        """`/abort_request`: managers/tokenizer_manager.py drops an rid no request in flight has;
        managers/scheduler.py `abort_request` then ends every call whose rid starts with it, a
        waiting one now, a running one at its next step."""
        if rid not in self.running and rid not in self.waiting:
            return
        self.aborted.add(rid)
        for call in list(self.waiting.values()):
            if call.rid.startswith(rid):
                self.abort_waiting(call, {"type": "abort", "message": "Abort in waiting queue"})
        for call in self.running.values():
            if call.rid.startswith(rid):
                call.to_abort = True

    async def answer(self, call: Call, request: Request) -> Response:
        """The unstreamed reply once the call ends; a client that leaves first gets its call
        aborted (managers/tokenizer_manager.py `_wait_one_response`, types 1 and 3)."""
        while not call.done.is_set():
            try:
                await asyncio.wait_for(call.done.wait(), 0.05)
            except TimeoutError:
                if await request.is_disconnected():
                    self.abort(call.rid)
        if call.error is not None:
            # entrypoints/http_server.py `_create_error_response`
            return JSONResponse({"error": {"message": call.error}}, status_code=400)
        finish = call.finish or {}
        if finish.get("status_code") == 400:  # `_handle_abort_finish_reason` raises a ValueError
            return JSONResponse({"error": {"message": finish["message"]}}, status_code=400)
        if finish.get("status_code") == 503:  # ... and an HTTPException for 503
            return JSONResponse({"detail": finish["message"]}, status_code=503)
        meta = self.meta_info(call, 0, len(call.output_ids), call.finish)
        return JSONResponse({"output_ids": call.output_ids, "meta_info": meta})

    async def stream(self, call: Call) -> AsyncIterator[bytes]:
        """`entrypoints/http_server.py` `generate_request` (streamed): a chunk per output the
        scheduler sent, the last with the finish reason, then `[DONE]`; a ValueError is sent as its
        error chunk (managers/tokenizer_manager.py `_handle_batch_output` builds the chunks)."""
        sent = 0
        while (count := await call.outputs.get()) is not None:
            yield self.chunk(call, sent, count, None)
            if self.incremental:
                sent = count
        if call.error is not None:
            yield _event({"error": _error_chunk(call.error)})
        elif call.ended_waiting:
            yield self.waiting_chunk(call)
        else:
            yield self.chunk(call, sent, len(call.output_ids), call.finish)
        yield b"data: [DONE]\n\n"

    def chunk(self, call: Call, sent: int, count: int, finish: dict[str, Any] | None) -> bytes:
        """One chunk: the output from token `sent` to `count` (`sent` is 0 unless incremental);
        `completion_tokens` is the total (`_slice_streaming_output_meta_info` slices only the
        per-token lists)."""
        meta = self.meta_info(call, sent, count, finish)
        return _event({"output_ids": call.output_ids[sent:count], "meta_info": meta})

    def waiting_chunk(self, call: Call) -> bytes:
        """managers/tokenizer_manager.py `_handle_abort_req`, streamed: only the last output id,
        with `completion_tokens` and the logprobs of all of them."""
        meta = self.meta_info(call, 0, len(call.output_ids), call.finish)
        return _event({"output_ids": call.output_ids[-1:], "meta_info": meta})

    def meta_info(
        self, call: Call, sent: int, count: int, finish: dict[str, Any] | None
    ) -> dict[str, Any]:
        """sglang's `meta_info` of the call's first `count` tokens, their logprobs from `sent` on."""
        meta: dict[str, Any] = {
            "id": call.rid,
            "finish_reason": finish,
            "prompt_tokens": call.prompt_tokens,
            "weight_version": self.weight_version,
            "completion_tokens": count,
            "cached_tokens": 0,
        }
        if finish is not None:  # only the reply or its stream's last chunk has it
            meta["e2e_latency"] = time.monotonic() - call.started
        if call.logprobs:
            # sglang returns [logprob, token id, None] per output token when it skips the tokenizer
            meta["output_token_logprobs"] = [
                [fake_logprob(i), call.output_ids[i], None] for i in range(sent, count)
            ]
        return meta

    async def abandon(self, rid: str) -> None:
        """managers/tokenizer_manager.py `create_abort_task`, run after every stream: 2 s later,
        the request is aborted if it still runs (its client left). One that ended needs no
        abort: the stand-in does not wait then (sglang's wait changes nothing it answers)."""
        if rid not in self.running and rid not in self.waiting:
            return
        await asyncio.sleep(ABORT_GRACE_S)
        self.abort(rid)

    # ------------------------------------------------------------------ the scheduler's state

    def idle(self) -> bool:
        """scheduler.py `is_fully_idle`: nothing running, nothing waiting."""
        return not self.running and not self.waiting

    async def die_unless_idle(self, assertion: str) -> None:
        """A command that asserts the server is idle: if it is not, the scheduler dies and the
        server with it: this request and every open connection are dropped, later ones refused."""
        if self.idle():
            return
        self.died = assertion
        self.on_death()
        await asyncio.Event().wait()  # cancelled when the server stops

    def loads(self) -> dict[str, Any]:
        """entrypoints/v1_loads.py: one load per data-parallel rank (managers/load_snapshot.py
        `to_dict`); the figures agl does not read are zero."""
        load = {
            "dp_rank": 0,
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": 0,
            "num_total_tokens": 0,
            "max_total_num_tokens": self.pool_tokens,
            "max_running_requests": 4096,
            "token_usage": 0.0,
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": 0.0,
        }
        return {"timestamp": datetime.now(UTC).isoformat(), "version": VERSION, "loads": [load]}

    # ------------------------------------------------------------------ the HTTP face

    def app(self) -> FastAPI:
        """The server: sglang's routes that agl uses, each answering as sglang 0.5.13 does."""
        app = FastAPI(title="sglang stand-in")
        app.add_middleware(Recorder, log=self.log)
        self.generation_routes(app)
        self.info_routes(app)
        self.memory_routes(app)
        return app

    def generation_routes(self, app: FastAPI) -> None:
        @app.post("/generate")
        async def generate(request: Request) -> Response:
            return await self.generate(_json(await request.body()) or {}, request)

        @app.post("/abort_request")
        async def abort_request(request: Request) -> Response:
            """entrypoints/http_server.py: a 200 with an empty body, whatever the rid."""
            body = _json(await request.body()) or {}
            if body.get("abort_all"):
                for rid in [*self.running, *self.waiting]:
                    self.abort(rid)
            else:
                self.abort(str(body.get("rid") or ""))
            return Response(status_code=200)

    def info_routes(self, app: FastAPI) -> None:
        @app.get("/model_info")
        async def model_info() -> dict[str, Any]:
            """entrypoints/http_server.py `model_info`: no context length here."""
            return {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
            }

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            """entrypoints/http_server.py `available_models`; the card is
            `entrypoints/openai/protocol.py`'s."""
            card = {
                "id": self.model_path,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": self.model_path,
                "parent": None,
                "max_model_len": self.context_len,
            }
            return {"object": "list", "data": [card]}

        @app.get("/v1/loads")
        async def loads() -> dict[str, Any]:
            return self.loads()

        @app.get("/server_info")
        @app.get("/get_server_info")
        async def server_info() -> Response:
            if self.launched_by_verl:
                return PlainTextResponse("Internal Server Error", status_code=500)
            return JSONResponse({"context_length": self.context_len, "version": VERSION})

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

    def memory_routes(self, app: FastAPI) -> None:
        """Sleep, wake, weight loading and the cache: what the trainer calls around an update."""

        @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
        async def release() -> None:
            """entrypoints/http_server.py: the route returns nothing, so FastAPI answers `null`."""
            await self.die_unless_idle(IDLE)
            self.released = True

        @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
        async def resume() -> None:
            self.released = False

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> Response:
            """entrypoints/http_server.py and managers/tokenizer_manager.py: loaded at once,
            asleep or not; then the cache is flushed, which asserts the server is idle."""
            body = _json(await request.body()) or {}
            path = str(body.get("model_path"))
            if not Path(path).is_dir():
                message = f"Failed to get weights iterator: {path} (repository not found)."
                content = {"success": False, "message": message, "num_paused_requests": 0}
                return JSONResponse(content, status_code=400)
            await self.die_unless_idle(FLUSH)
            if self.released:
                self.log.loaded_while_released.append(path)
            self.model_path = path
            if body.get("weight_version") is not None:
                self.weight_version = str(body["weight_version"])
            content = {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": 0,
            }
            return JSONResponse(content)

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request) -> Response:
            body = _json(await request.body()) or {}
            self.weight_version = str(body["new_version"])
            content = {
                "success": True,
                "message": f"Weight version updated to {body['new_version']}",
                "new_version": body["new_version"],
            }
            return JSONResponse(content)

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> Response:
            """scheduler.py `flush_cache`: refused (400) while a request runs or waits."""
            if not self.idle():
                return Response("Flush cache failed.\n", status_code=400)
            return Response("Cache flushed.\n")


class Recorder:
    """ASGI middleware: logs each request's path and JSON body, then hands the body on."""

    def __init__(self, app: ASGIApp, log: Log) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        self.log.requests.append((scope["path"], _json(raw)))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # a disconnect, when the client goes
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)


def _kill(server: uvicorn.Server) -> None:
    """What sglang's `kill_process_tree` does to its HTTP server, from inside its event loop: no
    more connections accepted, every open one dropped."""
    for listening in server.servers:
        listening.close()
    for connection in list(server.server_state.connections):
        connection.transport.abort()  # type: ignore[attr-defined]
    server.should_exit = True


def _streams_at(count: int, interval: int) -> bool:
    """output_streamer.py: whether a stream gets a chunk once the output has `count` tokens."""
    if interval > 1:
        return count % interval == 1
    return True


def _aborted(message: str) -> dict[str, Any]:
    """managers/schedule_batch.py `FINISH_ABORT(message).to_json()`, with no status code."""
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def _error_chunk(message: str) -> dict[str, Any]:
    """The error of a streamed request that failed (`entrypoints/http_server.py`
    `stream_results`)."""
    return {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}


def fake_logprob(index: int) -> float:
    """A made-up logprob for the index-th output token: distinct from its neighbours, always negative."""
    return -0.05 * (1 + index % 17)


async def read_stream(
    http: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[float]]:
    """A streamed `/generate` as a client reads it (the tests of both servers use it): the parsed
    chunks and when each arrived (seconds after the request). Asserts sglang's framing: a 200
    `text/event-stream` of `data: <json>\\n\\n` events, the last one `data: [DONE]`."""
    start = time.monotonic()
    payloads: list[str] = []
    arrivals: list[float] = []
    buffer = ""
    async with http.stream("POST", "/generate", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for text in resp.aiter_text():
            buffer += text
            while "\n\n" in buffer:
                end = buffer.index("\n\n")
                event = buffer[:end]
                buffer = buffer[end + 2 :]
                assert event.startswith("data: "), event
                payloads.append(event.removeprefix("data: "))
                arrivals.append(time.monotonic() - start)
    assert buffer == "" and payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    chunks = [json.loads(p) for p in payloads[:-1]]
    return chunks, arrivals[:-1]


def assemble(chunks: list[dict[str, Any]], incremental: bool) -> dict[str, Any]:
    """The reply the chunks add up to: the last chunk (cumulative) or all of them concatenated
    (incremental). Asserts what holds for every chunk: `finish_reason` is None on all but the last,
    `completion_tokens` is the total so far, each logprob pair names its chunk's token, and a
    cumulative chunk extends the one before."""
    ids: list[int] = []
    pairs: list[list[Any]] = []
    text = ""
    for i, chunk in enumerate(chunks):
        meta = chunk["meta_info"]
        last = i == len(chunks) - 1
        assert (meta["finish_reason"] is not None) == last, (i, meta["finish_reason"])
        chunk_pairs = meta.get("output_token_logprobs", [])
        if "output_token_logprobs" in meta:
            assert [t for _, t, _ in chunk_pairs] == chunk["output_ids"]
        if incremental:
            ids += chunk["output_ids"]
            pairs += chunk_pairs
            text += chunk.get("text", "")
        else:
            assert chunk["output_ids"][: len(ids)] == ids and pairs == chunk_pairs[: len(pairs)]
            ids = chunk["output_ids"]
            pairs = chunk_pairs
            text = chunk.get("text", "")
        assert meta["completion_tokens"] == len(ids)
    meta = {**chunks[-1]["meta_info"], "output_token_logprobs": pairs}
    return {"text": text, "output_ids": ids, "meta_info": meta}


def _event(body: dict[str, Any]) -> bytes:
    """One server-sent event, as `generate_request` writes it."""
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def _json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    return json.loads(raw)
