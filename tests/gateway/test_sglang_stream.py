"""The sglang stand-in's streamed `/generate` (`tests/sglang.py`), over real HTTP on 127.0.0.1, in
sglang 0.5.13's two modes: cumulative (its default) and incremental
(`--incremental-streaming-output`). The gateway's tests rely on it streaming as sglang does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sglang import FLUSH, IDLE, Reply, SglangStandIn, assemble, fake_logprob, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
MODES = {"cumulative": False, "incremental": True}
TEXT = "THOUGHT: look around.\n```bash\nls -la\n```"
LONG = "word " * 1000  # about 600 tokens: 6 s at 10 ms a token
EVIDENCE = json.loads((Path(__file__).parents[1] / "evidence" / "sglang-0.5.13.json").read_text())


@contextmanager
def standin(
    tiny_path: Path, script: list[str | Reply], mode: str, token_delay_s: float = 0.0
) -> Iterator[tuple[SglangStandIn, str]]:
    """A stand-in in `mode`, served; yields it and its base URL."""
    sglang = SglangStandIn(tiny_path, script, token_delay_s=token_delay_s, incremental=MODES[mode])
    with sglang.served() as base:
        yield sglang, base


async def leave_after_first_chunk(http: httpx.AsyncClient, rid: str) -> float:
    """A streamed `/generate` left after its first chunk, as a harness that goes; when it left."""
    async with http.stream("POST", "/generate", json=body(2000, rid=rid, stream=True)) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                break
    return time.monotonic()


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> None:
    """Polls `condition` until it holds; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true"
        await asyncio.sleep(0.01)


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
async def test_a_client_that_leaves_mid_stream_keeps_decoding_for_2_s_then_is_aborted(
    tiny_path: Path, mode: str
) -> None:
    """sglang aborts a streamed request whose client left only 2 s later (`create_abort_task`):
    until then it decodes, and `/v1/loads` counts it running. A stream read to its end is not
    aborted."""
    with standin(tiny_path, [TEXT, LONG], mode, token_delay_s=0.01) as (sglang, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            await read_stream(http, body(rid="finished"))
            left_at = await leave_after_first_chunk(http, "left")
            await asyncio.sleep(1.0)
            loads = (await http.get("/v1/loads")).json()["loads"]
            assert "left" in sglang.running and "left" not in sglang.aborted
            assert loads[0]["num_running_reqs"] == 1
            await wait_until(lambda: "left" in sglang.aborted, 5)
            aborted_after = time.monotonic() - left_at
            await wait_until(sglang.idle, 5)
            loads = (await http.get("/v1/loads")).json()["loads"]
    assert 1.9 <= aborted_after < 4.0  # 2 s from when the server saw the client go
    assert loads[0]["num_running_reqs"] + loads[0]["num_waiting_reqs"] == 0
    assert "finished" not in sglang.aborted


@pytest.mark.parametrize("mode", MODES)
async def test_abort_request_names_a_stream_by_rid_and_ends_it_with_the_abort_chunk(
    tiny_path: Path, mode: str
) -> None:
    """`/abort_request {"rid"}`: a 200 with an empty body (as the H200's); the request ends at its
    next step, its stream with a chunk whose finish reason is an abort without a status code, then
    `[DONE]`; the scheduler is idle at once."""
    with standin(tiny_path, [LONG], mode, token_delay_s=0.01) as (sglang, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            chunks: list[dict[str, Any]] = []

            async def read() -> None:
                chunks.extend((await read_stream(http, body(rid="r-1")))[0])

            reading = asyncio.create_task(read())
            await wait_until(lambda: "r-1" in sglang.running, 5)
            answer = await http.post("/abort_request", json={"rid": "r-1"})
            await asyncio.wait_for(reading, 5)
    streamed = assemble(chunks, MODES[mode])
    finish = streamed["meta_info"]["finish_reason"]
    assert answer.status_code == 200 and answer.text == ""
    assert finish == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    assert 0 < len(streamed["output_ids"]) < len(sglang.tokenizer.encode(LONG))
    assert sglang.idle()


@pytest.mark.parametrize("mode", MODES)
async def test_the_chunk_cadence_is_the_h200s(tiny_path: Path, mode: str) -> None:
    """A streamed `/generate` of 20 tokens chunks as the real server did on an H200
    (tests/evidence/sglang-0.5.13.json): a chunk per token by default; with `--stream-interval 8`,
    1, 8, 8 and the last 3 tokens. Its chunks carry no `meta_info` field the real ones lack (the
    last one, as the whole reply's, has `e2e_latency`)."""
    real = EVIDENCE[mode]
    interval = real["server_args"]["stream_interval"]
    sglang = SglangStandIn(tiny_path, [LONG], incremental=MODES[mode], stream_interval=interval)
    with sglang.served() as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            chunks, _ = await read_stream(http, body(20))
    assert [len(c["output_ids"]) for c in chunks] == real["stream_output_ids_lens"]
    assert chunks[-1]["meta_info"]["finish_reason"] == real["stream_last_finish_reason"]
    assert all(set(c["meta_info"]) <= set(real["stream_chunk_meta_keys"]) for c in chunks[:-1])
    assert set(chunks[-1]["meta_info"]) <= set(real["generate_meta_keys"])


async def test_a_requests_own_stream_interval_overrides_the_servers(tiny_path: Path) -> None:
    """`sampling_params.stream_interval` (sampling/sampling_params.py) sets one request's
    cadence."""
    with standin(tiny_path, [LONG], "incremental") as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            request = body(12)
            request["sampling_params"]["stream_interval"] = 4
            chunks, _ = await read_stream(http, request)
    assert [len(c["output_ids"]) for c in chunks] == [1, 4, 4, 3]


@pytest.mark.parametrize("route", ["/release_memory_occupation", "/update_weights_from_disk"])
async def test_release_or_a_weight_update_while_a_request_decodes_kills_the_server(
    tiny_path: Path, route: str
) -> None:
    """scheduler_components/weight_updater.py asserts the server is idle (the H200's crash log):
    the scheduler dies, the command is never answered, and every later connection is refused.
    Idle, the same command answers as the H200 did."""
    with standin(tiny_path, [LONG, LONG], "cumulative", token_delay_s=0.01) as (sglang, base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            idle = await http.post(route, json={"model_path": str(tiny_path)})
            await http.post("/resume_memory_occupation")
            await leave_after_first_chunk(http, "left")
            with pytest.raises(httpx.TransportError):
                await http.post(route, json={"model_path": str(tiny_path)})
            with pytest.raises(httpx.ConnectError):
                await http.post("/generate", json=body())
    assert idle.status_code == 200
    assert sglang.died in (IDLE, FLUSH)


async def test_the_context_edge_is_an_abort_with_status_400(tiny_path: Path) -> None:
    """A prompt of `min(C - 1, pool - 1) - 5` tokens or more is aborted by the scheduler with
    FINISH_ABORT status 400: streamed, a 200 whose one chunk says so; unstreamed, the 400. One
    token less is served."""
    sglang = SglangStandIn(tiny_path, ["Hi.", "Hi."], context_len=64)
    edge = min(64 - 1, sglang.pool_tokens - 1) - 5
    with sglang.served() as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            long = {**body(1), "input_ids": [5] * edge}
            chunks, _ = await read_stream(http, long)
            plain = await http.post("/generate", json=long)
            served = await http.post("/generate", json={**long, "input_ids": [5] * (edge - 1)})
    (chunk,) = chunks
    finish = chunk["meta_info"]["finish_reason"]
    assert chunk["output_ids"] == [] and chunk["meta_info"]["completion_tokens"] == 0
    assert finish["type"] == "abort" and finish["status_code"] == 400
    assert f"Input length ({edge} tokens) exceeds" in finish["message"]
    assert plain.status_code == 400 and "exceeds the maximum" in plain.json()["error"]["message"]
    assert served.status_code == 200


async def test_a_request_aborted_in_the_waiting_queue_streams_only_its_last_id(
    tiny_path: Path,
) -> None:
    """A request retracted to the waiting queue after 5 tokens, then aborted there (by the waiting
    time-out, a 503): managers/tokenizer_manager.py `_handle_abort_req` sends `output_ids` = the
    last id only, with `completion_tokens` and logprobs of all 5; with `--stream-interval 8` the
    client had seen 1."""
    script = [Reply(LONG, retract_after=5)]
    sglang = SglangStandIn(
        tiny_path, script, incremental=True, stream_interval=8, waiting_timeout_s=0.2
    )
    with sglang.served() as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            chunks, _ = await read_stream(http, body())
    first, last = chunks
    assert len(first["output_ids"]) == 1
    assert len(last["output_ids"]) == 1 and last["meta_info"]["completion_tokens"] == 5
    assert len(last["meta_info"]["output_token_logprobs"]) == 5
    assert last["meta_info"]["finish_reason"]["status_code"] == 503


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
    before = failed[:-1]  # a chunk per token sampled before the failure
    assert [c["meta_info"]["completion_tokens"] for c in before] == [1, 2]
    assert all(c["meta_info"]["finish_reason"] is None for c in before)


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
