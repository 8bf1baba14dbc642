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
- an aborted request is a 200 whose `finish_reason` is `{"type": "abort"}`, with the partial output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from transformers import AutoTokenizer

VERSION = "0.5.13"


@dataclasses.dataclass
class Reply:
    """One scripted completion: its text, and after how many tokens it is aborted (None: never)."""

    text: str
    abort_after: int | None = None


@dataclasses.dataclass
class Log:
    """What the stand-in saw, for the tests to check."""

    requests: list[tuple[str, Any]] = dataclasses.field(default_factory=list)  # (path, JSON body)
    loaded_while_released: list[str] = dataclasses.field(default_factory=list)  # model paths
    generated_while_released: int = 0

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
    ) -> None:
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.script = [r if isinstance(r, Reply) else Reply(r) for r in script or []]
        self.context_len = context_len
        self.vocab_size = len(self.tokenizer)
        self.token_delay_s = token_delay_s
        self.launched_by_verl = launched_by_verl
        self.weight_version = "default"  # server_args.py: ServerArgs.weight_version
        self.released = False
        self.aborted: set[str] = set()
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
        """`entrypoints/http_server.py` `generate_request` (not streamed): 400 with
        `{"error": {"message"}}` for a refused request; else `{"output_ids", "meta_info"}` (no
        `text`: the tokenizer is skipped)."""
        input_ids = list(body.get("input_ids") or [])
        params = dict(body.get("sampling_params") or {})
        problem = self.check(input_ids, params)
        if problem is not None:
            return JSONResponse({"error": {"message": problem}}, status_code=400)
        if self.released:
            self.log.generated_while_released += 1
        rid = body.get("rid") or uuid.uuid4().hex
        started = time.monotonic()
        reply = self.script.pop(0) if self.script else Reply("")
        wanted = [*self.tokenizer.encode(reply.text, add_special_tokens=False), self.end_id]
        max_new_tokens = params.get("max_new_tokens", 128)
        output_ids: list[int] = []
        finish: dict[str, Any] = {
            "type": "stop",
            "matched": self.end_id,
        }  # managers/schedule_batch.py FINISH_*
        for token in wanted:
            if len(output_ids) == max_new_tokens:
                finish = {"type": "length", "length": max_new_tokens}
                break
            if rid in self.aborted or reply.abort_after == len(output_ids):
                # managers/tokenizer_manager.py `_handle_abort_req`: the partial output, a 200
                finish = {"type": "abort", "message": "Abort in waiting queue"}
                break
            await asyncio.sleep(self.token_delay_s)
            output_ids.append(token)
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "weight_version": self.weight_version,
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - started,
        }
        if body.get("return_logprob"):
            # sglang returns [logprob, token id, None] per output token when it skips the tokenizer
            meta["output_token_logprobs"] = [
                [fake_logprob(i), t, None] for i, t in enumerate(output_ids)
            ]
        return JSONResponse({"output_ids": output_ids, "meta_info": meta})

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


def fake_logprob(index: int) -> float:
    """A made-up logprob for the index-th output token: distinct from its neighbours, always negative."""
    return -0.05 * (1 + index % 17)


def _json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    return json.loads(raw)
