"""The shapes of the embedded engine's `/generate` answers: the whole reply, and sglang's event
stream of it (`"stream": true`).

The stream is sglang 0.5.13's (`entrypoints/http_server.py` `generate_request` and
`managers/tokenizer_manager.py`, read from its wheel): `text/event-stream`, one
`data: <json>\\n\\n` chunk per sampled token while the client keeps up (the latest state when it
lags), then `data: [DONE]\\n\\n`. A chunk is `{"text", "output_ids", "meta_info"}`, `meta_info` as
the whole reply's, with `finish_reason` None on every chunk but the last. Cumulative (the default):
each chunk carries everything so far. Incremental (sglang's `--incremental-streaming-output`):
`text`, `output_ids` and `output_token_logprobs` carry only the new tokens; `completion_tokens`
stays the total so far. A failure sglang reports as a ValueError is sent as its error chunk, then
`[DONE]`. A client that disconnects cancels its job.

Aborts, as sglang answers them: a request aborted while running ends with its output so far and
`finish_reason` `{"type": "abort", "message": "Aborted", ...}`, in the usual shape; one aborted while
waiting gets `_handle_abort_req`'s shape (`aborted_waiting`); one whose prompt sglang's scheduler
refuses (`set_finish_with_abort`) a single chunk with no tokens and a 400 abort (`refusal`).

It does not validate requests or map failures before the stream starts to status codes (that is
`server.py`), nor sample (that is `batcher.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine.batcher import Engine, Job, Result, ScriptExhausted
from engine.requests import GenerateRequest

DISCONNECT_POLL_S = 0.1  # how often a waiting request checks whether its client is still there
DONE = b"data: [DONE]\n\n"


def meta_info(
    req: GenerateRequest, result: Result, latency: float, completion_tokens: int
) -> dict[str, Any]:
    """sglang's `meta_info` of `result` (all of a reply, or the tokens of one chunk)."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": result.finish,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": completion_tokens,
        "cached_tokens": result.cached_tokens,
        "weight_version": result.weight_version,
        "e2e_latency": latency,
    }
    if req.return_logprob:
        pairs = zip(result.logprobs, result.output_ids, strict=True)
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in pairs]
    return meta


def reply(engine: Engine, req: GenerateRequest, result: Result, latency: float) -> dict[str, Any]:
    """`/generate`'s answer in sglang's shape: the text, its token IDs and `meta_info`."""
    if result.aborted_waiting:
        return aborted_waiting(engine, req, result, latency, streamed=False)
    meta = meta_info(req, result, latency, len(result.output_ids))
    text = engine.tokenizer.decode(result.output_ids, skip_special_tokens=True)
    return {"text": text, "output_ids": result.output_ids, "meta_info": meta}


def aborted_waiting(
    engine: Engine, req: GenerateRequest, result: Result, latency: float, streamed: bool
) -> dict[str, Any]:
    """sglang's answer for a request aborted before it was decoded (`_handle_abort_req` in
    managers/tokenizer_manager.py): all its text, no prompt or cache counts, `completion_tokens`
    the count of all its output; streamed, `output_ids` is only the last one (or none)."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": result.finish,
        "weight_version": result.weight_version,
        "e2e_latency": latency,
    }
    if req.return_logprob:
        pairs = zip(result.logprobs, result.output_ids, strict=True)
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in pairs]
    meta["completion_tokens"] = len(result.output_ids)
    output_ids = result.output_ids
    if streamed:
        output_ids = result.output_ids[-1:]
    text = engine.tokenizer.decode(result.output_ids, skip_special_tokens=True)
    return {"text": text, "output_ids": output_ids, "meta_info": meta}


def refusal(engine: Engine, req: GenerateRequest, message: str) -> StreamingResponse:
    """sglang's stream for a prompt its scheduler refuses (`set_finish_with_abort`): one chunk
    without tokens whose finish reason is a 400 abort, then `[DONE]`."""
    finish = {
        "type": "abort",
        "message": message,
        "status_code": 400,
        "err_type": "BadRequestError",
    }
    result = Result(output_ids=[], logprobs=[], finish=finish, weight_version=engine.weight_version)
    body = {"text": "", "output_ids": [], "meta_info": meta_info(req, result, 0.0, 0)}
    return StreamingResponse(iter([event(body), DONE]), media_type="text/event-stream")


class Progress:
    """How many tokens a streamed job has sampled, as the event loop sees it: the model thread
    calls `notify` (the job's `on_token`) after each token that does not end the job."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.count = 0
        self.ticked = asyncio.Event()  # set when `count` grew since the last chunk was sent

    def notify(self, count: int) -> None:
        """Model thread: `count` tokens, with their logprobs, are in the job."""
        # the loop is closed when the server stopped first; the model thread must go on
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._update, count)

    def _update(self, count: int) -> None:
        self.count = count
        self.ticked.set()

    async def wait(self, done: asyncio.Future[Result], timeout: float | None = None) -> None:
        """Until a token is sampled since the last chunk, the job ends, or `timeout` passes."""
        ticked = asyncio.ensure_future(self.ticked.wait())
        either: set[asyncio.Future[Any]] = {done, ticked}
        await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        ticked.cancel()


class Detokenizer:
    """The text of a growing list of token IDs, piece by piece, as sglang's detokenizer sends it:
    each piece is decoded with the few tokens before it (for context), and a piece that ends
    inside a character (U+FFFD) is held back until the character is complete."""

    def __init__(self, engine: Engine) -> None:
        self.tokenizer = engine.tokenizer
        self.context = 0  # first token decoded with the new ones
        self.sent = 0  # tokens whose text was sent

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def piece(self, ids: list[int], count: int, final: bool) -> str:
        """The text that `ids[:count]` adds to what was sent; all of it when `final`."""
        before = self.decode(ids[self.context : self.sent])
        after = self.decode(ids[self.context : count])
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""
        self.context = self.sent
        self.sent = count
        return after[len(before) :]


class Stream:
    """One job's chunks: cumulative, or only what is new when `incremental`."""

    def __init__(
        self, engine: Engine, req: GenerateRequest, job: Job, incremental: bool, start: float
    ) -> None:
        self.engine = engine
        self.req = req
        self.job = job
        self.incremental = incremental
        self.start = start
        self.sent = 0  # tokens sent, in incremental mode
        self.text = Detokenizer(engine)

    def chunk(self, result: Result, count: int) -> bytes:
        """The event of `result`'s first `count` tokens: all of them (cumulative) or those not
        yet sent (incremental)."""
        first = 0
        if self.incremental:
            first = self.sent
            self.sent = count
        part = Result(
            output_ids=result.output_ids[first:count],
            logprobs=result.logprobs[first:count],
            finish=result.finish,
            weight_version=result.weight_version,
            cached_tokens=result.cached_tokens,
        )
        final = result.finish is not None
        if self.incremental:
            text = self.text.piece(result.output_ids, count, final)
        else:
            text = self.text.decode(part.output_ids)
        meta = meta_info(self.req, part, time.monotonic() - self.start, count)
        return event({"text": text, "output_ids": part.output_ids, "meta_info": meta})

    def so_far(self) -> Result:
        """The job as the model thread leaves it, not finished: its lists still grow, so a chunk
        takes only the tokens the model thread counted."""
        return Result(
            output_ids=self.job.output_ids,
            logprobs=self.job.logprobs,
            finish=None,
            weight_version=self.engine.weight_version,
            cached_tokens=self.job.cached,
        )

    async def events(self, progress: Progress) -> AsyncIterator[bytes]:
        """The chunks as the tokens come, the last one with the finish reason, then `[DONE]`."""
        try:
            async for count in self.counts(progress):
                yield self.chunk(self.so_far(), count)
            result = await asyncio.wrap_future(self.job.future)
            if result.aborted_waiting:
                latency = time.monotonic() - self.start
                yield event(aborted_waiting(self.engine, self.req, result, latency, streamed=True))
            else:
                yield self.chunk(result, len(result.output_ids))
        except (ValueError, ScriptExhausted) as e:
            yield error_event(str(e))
        yield DONE

    async def counts(self, progress: Progress) -> AsyncIterator[int]:
        """The token counts of the chunks before the last: as the model thread samples them (the
        latest when several came since the last chunk); in scripted mode, which answers at once,
        one per token."""
        done = asyncio.wrap_future(self.job.future)
        if self.engine.script is not None:
            result = await done
            for count in range(1, len(result.output_ids)):
                yield count
            return
        while True:
            await progress.wait(done)
            if done.done():
                return
            progress.ticked.clear()
            yield progress.count


def error_event(message: str) -> bytes:
    """sglang's chunk for a request that failed mid-stream (a ValueError there)."""
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "code": 400,
            "retryable": False,
        }
    }
    return event(body)


def event(body: dict[str, Any]) -> bytes:
    """One server-sent event of the stream."""
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


async def stream(
    engine: Engine, req: GenerateRequest, request: Request, incremental: bool
) -> Response:
    """Queue the request and answer with its event stream once it samples its first token (or
    ends); raises what it failed with before that, so the caller answers with a status code. A
    499 if the client goes first."""
    start = time.monotonic()
    progress = Progress()
    job = engine.submit(req.input_ids, req.sampling_params.sampling(), progress.notify, req.rid)
    if not await started(job, progress, request):
        return Response(status_code=499)
    chunks = Stream(engine, req, job, incremental, start)
    return StreamingResponse(
        chunks.events(progress),
        media_type="text/event-stream",
        background=BackgroundTask(abandon, job),
    )


async def started(job: Job, progress: Progress, request: Request) -> bool:
    """Wait until the job samples a token or ends; False if its client goes first (the job is then
    cancelled). Raises what the job failed with, before anything is sent."""
    done = asyncio.wrap_future(job.future)
    while not (done.done() or progress.ticked.is_set()):
        await progress.wait(done, DISCONNECT_POLL_S)
        if done.done() or progress.ticked.is_set():
            break
        if await request.is_disconnected():
            job.cancelled = True
            return False
    if done.done():
        done.result()
    return True


def abandon(job: Job) -> None:
    """After the stream: a job not finished lost its client, so the model thread drops it (as
    sglang's `create_abort_task`, without its 2 s grace)."""
    if not job.future.done():
        job.cancelled = True
