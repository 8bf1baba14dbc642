"""A scripted stand-in for an sglang 0.5.13 server as verl 0.9.1 launches it (`skip_tokenizer_init`).

sglang needs a GPU, so it cannot run here. This server answers the routes agl uses the way sglang's own
code does, read from its released wheel (`pip download --no-deps sglang==0.5.13`); each behaviour names
the file it comes from, under `sglang/srt/`. What it samples is scripted (completion texts, tokenized with
the model's tokenizer and closed by the end-of-turn token), and its logprobs are made-up but distinct
values: agl must record what the engine sent, whatever it is.

It is deliberately unkind where sglang is:
- `/server_info` and `/get_server_info` answer 500, as on every server verl launches (verl's
  `async_sglang_server.py` stores sglang's `PortArgs` as `scheduler_info`, and `entrypoints/http_server.py`
  then fails to build `{**asdict(server_args), **scheduler_info}`);
- `/release_memory_occupation` and `/resume_memory_occupation` answer 200 with the body `null`;
- `/update_weights_from_disk` loads at once, even while the memory is released;
- sampling parameters sglang refuses are refused with its 400 and message;
- an aborted request is a 200 whose `finish_reason` is `{"type": "abort"}`, with the partial output;
- `"stream": true` answers with sglang's event stream, cumulative unless `incremental` (sglang's
  `--incremental-streaming-output`); a client that leaves mid-stream aborts its request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from transformers import AutoTokenizer

VERSION = "0.5.13"


@dataclasses.dataclass
class Reply:
    """One scripted completion: its text, after how many tokens it is aborted, and after how many
    a ValueError stops it (None: never)."""

    text: str
    abort_after: int | None = None
    fail_after: int | None = None


@dataclasses.dataclass
class Call:
    """One `/generate` in flight: who asked, and what is sampled so far."""

    rid: str
    prompt_tokens: int
    logprobs: bool  # return_logprob
    started: float  # time.monotonic()
    output_ids: list[int] = dataclasses.field(default_factory=list)
    finish: dict[str, Any] | None = None


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
    """The state of one scripted sglang server; `app()` is its HTTP face."""

    def __init__(
        self,
        model_path: Path,
        script: list[str | Reply] | None = None,
        *,
        context_len: int = 2048,
        token_delay_s: float = 0.0,
        launched_by_verl: bool = True,
        incremental: bool = False,
    ) -> None:
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.script = [r if isinstance(r, Reply) else Reply(r) for r in script or []]
        self.context_len = context_len
        self.vocab_size = len(self.tokenizer)
        self.token_delay_s = token_delay_s
        self.launched_by_verl = launched_by_verl
        self.incremental = incremental  # server_args.py: incremental_streaming_output
        self.weight_version = "default"  # server_args.py: ServerArgs.weight_version
        self.released = False
        self.aborted: set[str] = set()  # rids, by /abort_request or a stream whose client left
        self.streaming: set[str] = set()  # rids of streams not yet finished
        self.log = Log()

    # ------------------------------------------------------------------ validation

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

    # ------------------------------------------------------------------ generation

    async def generate(self, body: dict[str, Any]) -> Response:
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
        rid = body.get("rid") or uuid.uuid4().hex
        reply = self.script.pop(0) if self.script else Reply("")
        max_new_tokens = params.get("max_new_tokens", 128)
        call = Call(
            rid=rid,
            prompt_tokens=len(input_ids),
            logprobs=bool(body.get("return_logprob")),
            started=time.monotonic(),
        )
        steps = self.sample(call, reply, max_new_tokens)
        if body.get("stream"):
            self.streaming.add(rid)
            return StreamingResponse(
                self.stream(call, steps),
                media_type="text/event-stream",
                background=BackgroundTask(self.abandon, rid),
            )
        try:
            async for _ in steps:
                pass
        except ValueError as e:
            # entrypoints/http_server.py `_create_error_response`
            return JSONResponse({"error": {"message": str(e)}}, status_code=400)
        meta = self.meta_info(call, 0, call.finish)
        return JSONResponse({"output_ids": call.output_ids, "meta_info": meta})

    async def sample(self, call: Call, reply: Reply, max_new_tokens: int) -> AsyncIterator[None]:
        """Append the reply's tokens to `call.output_ids`, one per `token_delay_s`, and yield once
        each token is known not to be the last; `call.finish` is set at the end
        (managers/schedule_batch.py FINISH_*)."""
        wanted = [*self.tokenizer.encode(reply.text, add_special_tokens=False), self.end_id]
        for token in wanted:
            if len(call.output_ids) == max_new_tokens:
                call.finish = {"type": "length", "length": max_new_tokens}
                self.log.finished_at.append(time.monotonic())
                return
            if call.rid in self.aborted or reply.abort_after == len(call.output_ids):
                # managers/tokenizer_manager.py `_handle_abort_req`: the partial output, a 200
                call.finish = {"type": "abort", "message": "Abort in waiting queue"}
                return
            if reply.fail_after == len(call.output_ids):
                raise ValueError(f"scripted failure after {reply.fail_after} tokens")
            if call.output_ids:
                yield
            await asyncio.sleep(self.token_delay_s)
            call.output_ids.append(token)
        call.finish = {"type": "stop", "matched": self.end_id}
        self.log.finished_at.append(time.monotonic())

    async def stream(self, call: Call, steps: AsyncIterator[None]) -> AsyncIterator[bytes]:
        """`entrypoints/http_server.py` `generate_request` (streamed): a chunk per token, the last
        with the finish reason, then `[DONE]`; a ValueError is sent as its error chunk
        (managers/tokenizer_manager.py `_handle_batch_output` builds the chunks)."""
        sent = 0
        try:
            async for _ in steps:
                yield self.chunk(call, sent, None)
                if self.incremental:
                    sent = len(call.output_ids)
            yield self.chunk(call, sent, call.finish)
        except ValueError as e:
            yield _event({"error": _error_chunk(str(e))})
        self.streaming.discard(call.rid)
        yield b"data: [DONE]\n\n"

    def chunk(self, call: Call, sent: int, finish: dict[str, Any] | None) -> bytes:
        """One chunk: the output from token `sent` on (0 unless incremental); `completion_tokens`
        stays the total (`_slice_streaming_output_meta_info` slices only the per-token lists)."""
        meta = self.meta_info(call, sent, finish)
        return _event({"output_ids": call.output_ids[sent:], "meta_info": meta})

    def meta_info(self, call: Call, sent: int, finish: dict[str, Any] | None) -> dict[str, Any]:
        """sglang's `meta_info` of the call so far, its logprobs from token `sent` on."""
        meta: dict[str, Any] = {
            "id": call.rid,
            "finish_reason": finish,
            "prompt_tokens": call.prompt_tokens,
            "weight_version": self.weight_version,
            "completion_tokens": len(call.output_ids),
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - call.started,
        }
        if call.logprobs:
            # sglang returns [logprob, token id, None] per output token when it skips the tokenizer
            meta["output_token_logprobs"] = [
                [fake_logprob(i), call.output_ids[i], None]
                for i in range(sent, len(call.output_ids))
            ]
        return meta

    def abandon(self, rid: str) -> None:
        """managers/tokenizer_manager.py `create_abort_task`: after the stream, a request not
        finished is aborted (sglang waits 2 s first; the stand-in does not)."""
        if rid in self.streaming:
            self.streaming.discard(rid)
            self.aborted.add(rid)

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
            return await self.generate(_json(await request.body()) or {})

        @app.post("/abort_request")
        async def abort_request(request: Request) -> Response:
            """entrypoints/http_server.py: a 200 with an empty body."""
            body = _json(await request.body()) or {}
            self.aborted.add(str(body.get("rid")))
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
            self.released = True

        @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
        async def resume() -> None:
            self.released = False

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> Response:
            """entrypoints/http_server.py and managers/tokenizer_manager.py: loaded at once,
            asleep or not."""
            body = _json(await request.body()) or {}
            path = str(body.get("model_path"))
            if not Path(path).is_dir():
                message = f"Failed to get weights iterator: {path} (repository not found)."
                content = {"success": False, "message": message, "num_paused_requests": 0}
                return JSONResponse(content, status_code=400)
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
