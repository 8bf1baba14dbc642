"""The sglang stand-in's streamed `/generate` (`tests/sglang.py`), over real HTTP on 127.0.0.1, in
sglang 0.5.13's two modes: cumulative (its default) and incremental
(`--incremental-streaming-output`). The gateway's tests rely on it streaming as sglang does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import serve
from tests.sglang import Reply, SglangStandIn, assemble, fake_logprob, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
MODES = {"cumulative": False, "incremental": True}
TEXT = "THOUGHT: look around.\n```bash\nls -la\n```"


@contextmanager
def standin(
    tiny_path: Path, script: list[str | Reply], mode: str, token_delay_s: float = 0.0
) -> Iterator[tuple[SglangStandIn, str]]:
    """A stand-in in `mode`, served; yields it and its base URL."""
    sglang = SglangStandIn(tiny_path, script, token_delay_s=token_delay_s, incremental=MODES[mode])
    with serve(sglang.app()) as base:
        yield sglang, base


def body(n: int = 128, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, "temperature": 0}
    return {"input_ids": [1, 2, 3], "sampling_params": params, "return_logprob": True, **extra}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("max_new_tokens", [128, 5])
async def test_a_stream_adds_up_to_the_unstreamed_reply(
    tiny_path: Path, mode: str, max_new_tokens: int
) -> None:
    """For the same scripted reply, the last chunk (cumulative) or the concatenation of all chunks
    (incremental) equals the unstreamed reply in ids, logprobs and finish reason (stop, or length
    when cut); one chunk per token, none with a finish reason but the last, and no `text`
    (the tokenizer is skipped)."""
    with standin(tiny_path, [TEXT, TEXT], mode) as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            whole = (await http.post("/generate", json=body(max_new_tokens))).json()
            chunks, _ = await read_stream(http, body(max_new_tokens))
    streamed = assemble(chunks, MODES[mode])
    assert len(whole["output_ids"]) == min(max_new_tokens, len(whole["output_ids"]))
    assert streamed["output_ids"] == whole["output_ids"]
    assert len(chunks) == len(whole["output_ids"])
    wanted = whole["meta_info"]
    got = streamed["meta_info"]
    assert got["finish_reason"] == wanted["finish_reason"]
    assert got["output_token_logprobs"] == wanted["output_token_logprobs"]
    assert [lp for lp, _, _ in got["output_token_logprobs"]] == [
        fake_logprob(i) for i in range(len(whole["output_ids"]))
    ]
    assert all("text" not in chunk for chunk in chunks)


@pytest.mark.parametrize("mode", MODES)
async def test_the_first_chunk_leaves_before_the_generation_ends(
    tiny_path: Path, mode: str
) -> None:
    """With 50 ms per token, the first chunk arrives after about one token's delay, well before
    the reply's last."""
    with standin(tiny_path, [TEXT], mode, token_delay_s=0.05) as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            chunks, arrivals = await read_stream(http, body())
    tokens = chunks[-1]["meta_info"]["completion_tokens"]
    assert tokens > 10
    assert arrivals[0] < 0.05 * 4 < 0.05 * (tokens - 1) <= arrivals[-1], arrivals


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_leaves_mid_stream_aborts_its_request(
    tiny_path: Path, mode: str
) -> None:
    """Closing the stream after its first chunk aborts the request (recorded in `aborted`, as
    sglang's `create_abort_task` would abort it); a stream read to its end is not aborted."""
    with standin(tiny_path, [TEXT, TEXT], mode, token_delay_s=0.02) as (sglang, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            await read_stream(http, body(rid="finished"))
            async with http.stream("POST", "/generate", json=body(rid="left", stream=True)) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        break
            deadline = time.monotonic() + 5
            while "left" not in sglang.aborted:
                assert time.monotonic() < deadline, "the stand-in did not record the abort"
                await asyncio.sleep(0.02)
    assert "finished" not in sglang.aborted


@pytest.mark.parametrize("mode", MODES)
async def test_an_abort_or_an_error_mid_stream_ends_it_as_sglang_does(
    tiny_path: Path, mode: str
) -> None:
    """A request aborted after 3 tokens ends with `{"type": "abort"}` and the partial output; a
    ValueError after 2 tokens is sent as sglang's error chunk, then `[DONE]`."""
    script: list[str | Reply] = [Reply(TEXT, abort_after=3), Reply(TEXT, fail_after=2)]
    with standin(tiny_path, script, mode) as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            aborted, _ = await read_stream(http, body())
            failed, _ = await read_stream(http, body())
    streamed = assemble(aborted, MODES[mode])
    assert streamed["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(streamed["output_ids"]) == 3
    error = failed[-1]["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert error["retryable"] is False and "after 2 tokens" in error["message"]
    (before,) = failed[:-1]  # the first token's chunk; the second never left
    assert len(before["output_ids"]) == 1 and before["meta_info"]["finish_reason"] is None


async def test_a_refused_streamed_request_is_a_stream_holding_the_error(tiny_path: Path) -> None:
    """sglang checks a streamed request inside its stream: too long, it answers 200, with the
    error chunk and `[DONE]`; unstreamed, the JSON 400."""
    with standin(tiny_path, [TEXT, TEXT], "cumulative") as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            streamed = await http.post("/generate", json=body(5000, stream=True))
            plain = await http.post("/generate", json=body(5000, stream=False))
    assert streamed.status_code == 200
    events = [line for line in streamed.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[0].removeprefix("data: "))["error"]
    assert "maximum context length" in error["message"] and error["code"] == 400
    assert plain.status_code == 400 and "maximum context length" in plain.json()["error"]["message"]
