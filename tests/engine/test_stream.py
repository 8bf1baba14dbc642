"""The embedded engine's streamed `/generate` (`engine/stream.py`), over real HTTP on 127.0.0.1,
in sglang's two modes: cumulative (its default) and incremental (`--incremental-streaming-output`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl.settings import from_flags
from engine.batcher import Engine
from engine.server import EngineSettings, create_app
from tests.engine.conftest import SHORT_CONTEXT, loads_until
from tests.gateway.conftest import serve
from tests.sglang import assemble, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
MODES = {"cumulative": False, "incremental": True}
SCRIPT = ["THOUGHT: look around.\n```bash\nls -la\n```", "ünï 日本 🙂 done."]
# sglang's `FINISH_ABORT().to_json()`: the finish reason of a request aborted while running
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
LONG = {"max_new_tokens": 30000, "ignore_eos": True}  # runs until it is aborted


@pytest.fixture(scope="module")
def urls(engine: Engine) -> Iterator[dict[str, str]]:
    """One server per mode, both on the same engine."""
    with (
        serve(create_app(engine)) as cumulative,
        serve(create_app(engine, incremental=True)) as inc,
    ):
        yield {"cumulative": cumulative, "incremental": inc}


def greedy(n: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": n, "temperature": 0, **extra}


@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_adds_up_to_the_unstreamed_reply(urls: dict[str, str], mode: str) -> None:
    """For the same greedy request, the last chunk (cumulative) or the concatenation of all chunks
    (incremental) equals the unstreamed reply: ids, logprobs, text and finish reason; every chunk
    before the last has no finish reason, and each carries new tokens (one chunk per step)."""
    body = {"input_ids": list(range(20, 45)), "sampling_params": greedy(40), "return_logprob": True}
    async with httpx.AsyncClient(base_url=urls[mode], timeout=30) as http:
        await http.post("/flush_cache")
        whole = (await http.post("/generate", json=body)).json()
        await http.post("/flush_cache")
        chunks, _ = await read_stream(http, body)
    streamed = assemble(chunks, MODES[mode])
    assert len(chunks) > 1 and all(chunk["output_ids"] for chunk in chunks)
    assert streamed["output_ids"] == whole["output_ids"]
    assert streamed["text"] == whole["text"]
    wanted = whole["meta_info"]
    got = streamed["meta_info"]
    assert got["finish_reason"] == wanted["finish_reason"]
    assert [t for _, t, _ in got["output_token_logprobs"]] == whole["output_ids"]
    logprobs = [lp for lp, _, _ in got["output_token_logprobs"]]
    assert logprobs == pytest.approx([lp for lp, _, _ in wanted["output_token_logprobs"]], abs=1e-4)
    assert len({chunk["meta_info"]["id"] for chunk in chunks}) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_the_first_chunk_leaves_long_before_the_generation_ends(
    urls: dict[str, str], mode: str
) -> None:
    """Chunks leave as the model thread samples: the first of a 300-token reply arrives in less
    than half the time the last one does."""
    params = greedy(300, ignore_eos=True)
    async with httpx.AsyncClient(base_url=urls[mode], timeout=30) as http:
        chunks, arrivals = await read_stream(http, {"input_ids": [1, 2], "sampling_params": params})
    assert chunks[-1]["meta_info"]["completion_tokens"] == 300
    assert arrivals[0] < arrivals[-1] / 2, arrivals


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_leaves_mid_stream_aborts_its_request(
    urls: dict[str, str], engine: Engine, mode: str
) -> None:
    """Closing the stream after its first chunk cancels the job: the engine counts an abort and
    serves the next request."""
    aborted = engine.stats["aborted"]
    params = {"max_new_tokens": 30000, "ignore_eos": True}
    body = {"input_ids": [1], "sampling_params": params, "stream": True}
    async with httpx.AsyncClient(base_url=urls[mode], timeout=30) as http:
        async with http.stream("POST", "/generate", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    break
        deadline = time.monotonic() + 5
        while engine.stats["aborted"] == aborted:
            assert time.monotonic() < deadline, "the engine kept generating for a client that left"
            await asyncio.sleep(0.05)
        after = await http.post("/generate", json={"input_ids": [1], "sampling_params": greedy(3)})
    assert len(after.json()["output_ids"]) == 3


@pytest.mark.parametrize("mode", MODES)
async def test_scripted_mode_streams_one_chunk_per_token(tiny_path: Path, mode: str) -> None:
    """The script answers at once, yet streams as sglang would: one chunk per token, adding up
    to the scripted text (multi-byte characters included); once the script is exhausted, a
    streamed request is refused with the plain 400 before any chunk."""
    eng = Engine(tiny_path, script=list(SCRIPT))
    try:
        with serve(create_app(eng, incremental=MODES[mode])) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                replies = [
                    await read_stream(http, {"input_ids": [5, 6], "return_logprob": True})
                    for _ in SCRIPT
                ]
                refused = await http.post("/generate", json={"input_ids": [5], "stream": True})
    finally:
        eng.close()
    for text, (chunks, _) in zip(SCRIPT, replies, strict=True):
        streamed = assemble(chunks, MODES[mode])
        wanted = [*eng.tokenizer.encode(text, add_special_tokens=False), eng.eos_id]
        assert streamed["output_ids"] == wanted and len(chunks) == len(wanted)
        assert streamed["text"] == text
        assert streamed["meta_info"]["finish_reason"] == {"type": "stop", "matched": eng.eos_id}
    assert (
        refused.status_code == 400 and "no completions left" in refused.json()["error"]["message"]
    )


async def test_a_request_refused_before_streaming_is_a_plain_400(urls: dict[str, str]) -> None:
    """Validation comes before the stream: a bad request gets the JSON 400, not an event stream."""
    body = {"input_ids": [1], "sampling_params": {"top_k": 0}, "stream": True}
    async with httpx.AsyncClient(base_url=urls["cumulative"], timeout=30) as http:
        resp = await http.post("/generate", json=body)
    assert resp.status_code == 400 and "top_k" in resp.json()["error"]["message"]


def test_incremental_streaming_output_is_a_flag_as_sglangs() -> None:
    """`agl engine --incremental-streaming-output` turns the mode on, as sglang's flag; off by
    default."""
    on = from_flags(EngineSettings, ["--incremental-streaming-output"], "agl engine")
    off = from_flags(EngineSettings, [], "agl engine")
    assert on.incremental_streaming_output is True and off.incremental_streaming_output is False


@pytest.mark.parametrize("mode", MODES)
async def test_a_stream_aborted_by_rid_ends_with_the_abort_chunk_then_done(
    urls: dict[str, str], mode: str
) -> None:
    """`/abort_request` ends a running stream at its next step: the last chunk carries sglang's
    abort finish reason and the tokens as the mode sends them (all so far, or the new ones)."""
    body = {"input_ids": [1, 2], "sampling_params": LONG, "rid": f"stream-{mode}"}
    async with httpx.AsyncClient(base_url=urls[mode], timeout=60) as http:
        await loads_until(http, running=0, waiting=0)
        reading = asyncio.create_task(read_stream(http, body))
        await loads_until(http, running=1, waiting=0)
        await http.post("/abort_request", json={"rid": f"stream-{mode}"})
        chunks, _ = await reading
    streamed = assemble(chunks, MODES[mode])
    assert streamed["meta_info"]["finish_reason"] == ABORTED
    assert 0 < len(streamed["output_ids"]) < LONG["max_new_tokens"]
    assert chunks[-1]["meta_info"]["id"] == f"stream-{mode}"


@pytest.fixture(params=list(MODES))
def narrow(tiny_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A server (in each mode) whose engine decodes one request at a time, so a second waits."""
    eng = Engine(tiny_path, max_batch=1)
    try:
        with serve(create_app(eng, incremental=MODES[request.param])) as base:
            yield base
    finally:
        eng.close()


async def test_a_stream_aborted_while_waiting_gets_sglangs_waiting_queue_chunk(narrow: str) -> None:
    """sglang's `_handle_abort_req` chunk: `output_ids` is the last token (none here), and
    `completion_tokens` counts them all; no prompt or cache counts."""
    first = {"input_ids": [1, 2], "sampling_params": LONG, "rid": "first", "stream": True}
    second = {**first, "rid": "second"}
    async with httpx.AsyncClient(base_url=narrow, timeout=60) as http:
        running = asyncio.create_task(http.post("/generate", json=first))
        # the first runs before the second is sent: two connections may reach the server in
        # either order, and the test aborts the one that waits
        await loads_until(http, running=1, waiting=0)
        reading = asyncio.create_task(read_stream(http, second))
        await loads_until(http, running=1, waiting=1)
        await http.post("/abort_request", json={"rid": "second"})
        chunks, _ = await reading
        await http.post("/abort_request", json={"rid": "first"})
        await running
    assert len(chunks) == 1
    meta = chunks[0].pop("meta_info")
    assert chunks[0] == {"text": "", "output_ids": []}
    assert meta.pop("e2e_latency") >= 0
    assert meta == {
        "id": "second",
        "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
        "weight_version": "0",
        "completion_tokens": 0,
    }


@pytest.mark.parametrize("mode", MODES)
async def test_a_prompt_at_sglangs_input_limit_streams_one_400_abort_chunk(
    short_path: Path, mode: str
) -> None:
    """sglang's scheduler refuses `max_req_input_len` prompt tokens or more; streamed, that is a
    200 stream of one chunk without tokens whose finish reason is a 400 abort, then `[DONE]`. One
    token fewer streams as usual."""
    limit = SHORT_CONTEXT - 6
    message = (
        f"Input length ({limit} tokens) exceeds the maximum allowed length ({limit} tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    eng = Engine(short_path, max_batch=2)
    try:
        with serve(create_app(eng, incremental=MODES[mode])) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                refused, _ = await read_stream(
                    http, {"input_ids": [5] * limit, "sampling_params": greedy(2), "rid": "edge"}
                )
                served, _ = await read_stream(
                    http, {"input_ids": [5] * (limit - 1), "sampling_params": greedy(2)}
                )
    finally:
        eng.close()
    assert len(refused) == 1
    meta = refused[0]["meta_info"]
    assert refused[0]["output_ids"] == [] and meta["completion_tokens"] == 0
    assert meta["id"] == "edge"
    assert meta["finish_reason"] == {
        "type": "abort",
        "message": message,
        "status_code": 400,
        "err_type": "BadRequestError",
    }
    assert len(assemble(served, MODES[mode])["output_ids"]) == 2
