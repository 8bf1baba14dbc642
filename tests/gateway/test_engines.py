"""The engine client against scripted stand-ins that reply the way sglang does, over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from gateway.engine_replies import EngineAborted, EngineError, EngineRejected, EngineUnavailable
from gateway.engines import EngineClient, TransportError
from tests.gateway.conftest import serve
from tests.sglang import Reply, SglangStandIn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """uvloop, as in `agl gateway`: its transports fail differently from asyncio's own."""
    return "asyncio", {"use_uvloop": True}


def sglang_reply(input_ids: list[int]) -> dict[str, Any]:
    """What sglang's /generate returns with skip_tokenizer_init and return_logprob."""
    out = [len(input_ids) + i for i in range(3)]
    return {
        "output_ids": out,
        "meta_info": {
            "id": "f00",
            "finish_reason": {"type": "length", "length": 3},
            "prompt_tokens": len(input_ids),
            "completion_tokens": 3,
            "cached_tokens": 0,
            "output_token_logprobs": [[-0.25 * (i + 1), t, None] for i, t in enumerate(out)],
            "weight_version": "7",
            "e2e_latency": 0.01,
        },
    }


class StandIn:
    """A replica that replays scripted (status, body, delay) replies, then answers like sglang."""

    def __init__(self) -> None:
        self.script: list[tuple[int, Any, float]] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.peers: list[int] = []  # the client port of each request: which connection carried it
        self.app = FastAPI()

        @self.app.api_route("/{path:path}", methods=["GET", "POST"])
        async def anything(path: str, request: Request) -> Response:
            raw = await request.body()
            body = json.loads(raw) if raw else None
            self.requests.append((request.method, "/" + path, body))
            self.peers.append(request.client.port if request.client else 0)
            status, reply, delay = self.script.pop(0) if self.script else (200, None, 0.0)
            await asyncio.sleep(delay)
            if reply is None:
                reply = sglang_reply(body["input_ids"]) if path == "generate" else ""
            if isinstance(reply, str):
                return PlainTextResponse(reply, status)
            return JSONResponse(reply, status)

    def paths(self) -> list[str]:
        return [p for _, p, _ in self.requests]


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[tuple[str, StandIn]]]:
    stand_ins = [StandIn() for _ in range(3)]
    with serve(stand_ins[0].app) as a, serve(stand_ins[1].app) as b, serve(stand_ins[2].app) as c:
        yield list(zip([a, b, c], stand_ins, strict=True))


@pytest.fixture
def stand_ins(replicas: list[tuple[str, StandIn]]) -> list[tuple[str, StandIn]]:
    for _, s in replicas:
        s.script.clear()
        s.requests.clear()
        s.peers.clear()
    return replicas


def dead_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: connection refused
    return f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def raw_replica(
    replies: list[bytes], *, close_after_reply: bool | str = False
) -> AsyncIterator[tuple[str, list[int]]]:
    """A replica that answers each request with the next scripted bytes, as they are: for the
    framings and connection endings uvicorn never produces; an empty reply closes the connection
    without a word, as a server does whose keep-alive ran out just as a request came. Yields its
    URL and a list that gets one entry per connection accepted. `close_after_reply`: it closes
    each connection after one reply ("reset": with a TCP reset)."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: *(\d+)", head.lower())
                await reader.readexactly(int(length.group(1)) if length else 0)
                reply = replies.pop(0)
                if not reply:
                    break
                writer.write(reply)
                await writer.drain()
                if close_after_reply == "reset":  # a TCP reset instead of an orderly close
                    writer.get_extra_info("socket").setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                if close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections
    finally:
        server.close()


def reply_bytes(body: Any, framing: str = "length") -> bytes:
    """An HTTP/1.1 200 reply: sized by Content-Length, chunked, or read to the end of the stream."""
    data = json.dumps(body).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    if framing == "chunked":
        middle = len(data) // 2
        chunks = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in (data[:middle], data[middle:]))
        return head + b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    if framing == "to_end":
        return head + b"connection: close\r\n\r\n" + data
    return head + b"content-length: %d\r\n\r\n" % len(data) + data


def rollout_homed_at(index: int, n: int) -> str:
    return next(f"r{i}" for i in range(1000) if zlib.crc32(f"r{i}".encode()) % n == index)


def client(urls: list[str], **kw: Any) -> EngineClient:
    return EngineClient(urls, **{"backoff_s": 0.01, "max_backoff_s": 0.05, **kw})


async def test_generate_parses_sglang_reply(stand_ins: list[tuple[str, StandIn]]) -> None:
    url, s = stand_ins[0]
    async with client([url]) as engines:
        g = await engines.generate([5, 6], {"max_new_tokens": 3, "temperature": 0.5})
    assert (g.output_ids, g.logprobs) == ([2, 3, 4], [-0.25, -0.5, -0.75])
    assert (g.finish_reason, g.replica) == ("length", url)
    (method, path, body) = s.requests[0]
    assert (method, path) == ("POST", "/generate")
    rid = body.pop("rid")  # each generation's own, to abort it by
    assert len(rid) == 32 and int(rid, 16) >= 0
    assert body == {
        "input_ids": [5, 6],
        "sampling_params": {"max_new_tokens": 3, "temperature": 0.5},
        "return_logprob": True,
    }


async def test_requests_share_one_kept_alive_connection(
    stand_ins: list[tuple[str, StandIn]],
) -> None:
    url, s = stand_ins[0]
    async with client([url]) as engines:
        for _ in range(3):
            await engines.generate([1], {})
    assert len(s.peers) == 3 and len(set(s.peers)) == 1


async def test_a_kept_connection_the_engine_closes_unanswered_is_replaced_without_a_retry() -> None:
    replies = [reply_bytes(sglang_reply([1])), b"", reply_bytes(sglang_reply([1, 2]))]
    async with raw_replica(replies) as (url, connections), client([url], attempts=1) as engines:
        assert (await engines.generate([1], {})).output_ids == [1, 2, 3]
        # sent again on a new connection
        assert (await engines.generate([1, 2], {})).output_ids == [2, 3, 4]
        assert engines.replicas[0].down_until == 0.0
    assert len(connections) == 2


@pytest.mark.parametrize("ending", [True, "reset"])
async def test_a_kept_connection_the_engine_ended_while_idle_is_not_reused(
    ending: bool | str,
) -> None:
    replies = [reply_bytes(sglang_reply([1])), reply_bytes(sglang_reply([1, 2]))]
    async with (
        raw_replica(replies, close_after_reply=ending) as (url, connections),
        client([url], attempts=1) as engines,
    ):
        assert (await engines.generate([1], {})).output_ids == [1, 2, 3]
        await asyncio.sleep(0.05)  # the end reaches the client meanwhile
        assert (await engines.generate([1, 2], {})).output_ids == [2, 3, 4]
    assert len(connections) == 2


@pytest.mark.parametrize("framing", ["chunked", "to_end"])
async def test_chunked_replies_and_replies_that_run_to_the_end_of_the_stream(framing: str) -> None:
    replies = [reply_bytes(sglang_reply([1, 2]), framing) for _ in range(2)]
    async with (
        raw_replica(replies, close_after_reply=framing == "to_end") as (url, connections),
        client([url], attempts=1) as engines,
    ):
        for _ in range(2):
            assert (await engines.generate([1, 2], {})).output_ids == [2, 3, 4]
    # a reply read to the end used up its connection
    assert len(connections) == (2 if framing == "to_end" else 1)


async def test_a_reply_cut_off_midway_is_a_transport_failure_and_retried() -> None:
    whole = reply_bytes(sglang_reply([1]))
    async with (
        raw_replica([whole[:-10], whole], close_after_reply=True) as (url, connections),
        client([url], attempts=2) as engines,
    ):
        assert (await engines.generate([1], {})).output_ids == [1, 2, 3]
    assert len(connections) == 2


async def test_4xx_is_rejected_at_once_with_the_engines_message(
    stand_ins: list[tuple[str, StandIn]],
) -> None:
    url, s = stand_ins[0]
    s.script = [(400, {"error": {"message": "token id 99999 is outside the vocabulary"}}, 0.0)]
    async with client([url], attempts=3) as engines:
        with pytest.raises(
            EngineRejected, match=r"\(400\): token id 99999 is outside the vocabulary$"
        ):
            await engines.generate([99999], {})
    assert len(s.requests) == 1


async def test_5xx_is_retried_until_it_succeeds(stand_ins: list[tuple[str, StandIn]]) -> None:
    url, s = stand_ins[0]
    s.script = [(503, {"error": {"message": "busy"}}, 0.0), (500, "Internal Server Error", 0.0)]
    async with client([url], attempts=3) as engines:
        g = await engines.generate([1], {})
    assert g.output_ids == [1, 2, 3] and len(s.requests) == 3


async def test_attempts_are_bounded_and_the_error_is_typed(
    stand_ins: list[tuple[str, StandIn]],
) -> None:
    url, s = stand_ins[0]
    s.script = [(500, {"message": "CUDA out of memory"}, 0.0)] * 5
    async with client([url], attempts=3) as engines:
        with pytest.raises(EngineUnavailable, match="CUDA out of memory") as e:
            await engines.generate([1], {})
    assert len(s.requests) == 3 and e.value.__cause__ is not None


async def test_timeouts_are_retried_and_bounded(stand_ins: list[tuple[str, StandIn]]) -> None:
    """Each try that times out is aborted by its own rid before the next: no generation runs on
    behind a call that gave it up."""
    url, s = stand_ins[0]
    slow = (200, None, 1.5)
    aborted = (200, "", 0.0)  # sglang's `/abort_request`: a 200 with an empty body
    s.script = [slow, aborted, slow, aborted]
    start = time.monotonic()
    async with client([url], attempts=2, timeout_s=0.2) as engines:
        with pytest.raises(EngineUnavailable) as e:
            await engines.generate([1], {})
    assert time.monotonic() - start < 1.2
    assert isinstance(e.value.__cause__, TimeoutError)
    assert s.paths() == ["/generate", "/abort_request"] * 2
    rids = [body["rid"] for _, _, body in s.requests]
    assert rids[0] == rids[1] != rids[2] == rids[3]


async def test_a_malformed_reply_is_a_protocol_error(stand_ins: list[tuple[str, StandIn]]) -> None:
    url, s = stand_ins[0]
    s.script = [
        (
            200,
            {"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-1.0, 9, None]]}},
            0.0,
        )
    ]
    async with client([url]) as engines:
        with pytest.raises(EngineError, match="malformed") as e:
            await engines.generate([1], {})
    assert not isinstance(e.value, EngineUnavailable | EngineRejected)


async def test_a_rollout_sticks_to_its_replica(stand_ins: list[tuple[str, StandIn]]) -> None:
    urls = [u for u, _ in stand_ins]
    async with client(urls) as engines:
        homes = {}
        for i in range(20):
            for _ in range(3):
                g = await engines.generate([1], {}, rollout_id=f"rollout-{i}")
                assert homes.setdefault(i, g.replica) == g.replica
    assert len(set(homes.values())) == 3  # rollouts spread over the replicas


async def test_failover_goes_to_the_least_loaded_replica_that_is_up(
    stand_ins: list[tuple[str, StandIn]],
) -> None:
    urls = [u for u, _ in stand_ins]
    (_, a), (_, b), (url_c, _) = stand_ins
    at_a, at_b = rollout_homed_at(0, 3), rollout_homed_at(1, 3)
    a.script = [(500, "boom", 0.0)]
    b.script = [(200, None, 0.5)]
    async with client(urls, attempts=2, down_s=60) as engines:
        slow = asyncio.create_task(engines.generate([1], {}, rollout_id=at_b))
        while not b.requests:
            await asyncio.sleep(0.01)
        g = await engines.generate([1], {}, rollout_id=at_a)  # A fails; B is busy; C is idle
        assert g.replica == url_c and a.paths() == ["/generate"]
        g = await engines.generate([1], {}, rollout_id=at_a)  # A is still marked down
        assert g.replica != urls[0] and a.paths() == ["/generate"]
        await slow


async def test_a_dead_replica_fails_over(stand_ins: list[tuple[str, StandIn]]) -> None:
    dead, (live, _) = dead_url(), stand_ins[0]
    async with client([dead, live], attempts=2) as engines:
        g = await engines.generate([1], {}, rollout_id=rollout_homed_at(0, 2))
        assert g.replica == live


async def test_a_single_dead_replica_is_unavailable_after_all_attempts() -> None:
    async with client([dead_url()], attempts=3) as engines:
        with pytest.raises(EngineUnavailable, match="after 3 attempts") as e:
            await engines.generate([1], {})
    assert isinstance(e.value.__cause__, TransportError)


async def test_model_info_fails_over(stand_ins: list[tuple[str, StandIn]]) -> None:
    (url, s) = stand_ins[0]
    s.script = [(200, {"model_path": "/m", "tokenizer_path": "/t", "weight_version": "2"}, 0.0)]
    s.script.append((200, {"object": "list", "data": [{"id": "/m", "owned_by": "sglang"}]}, 0.0))
    s.script.append((404, {"detail": "Not Found"}, 0.0))  # an engine without `/v1/loads`
    async with client([dead_url(), url], attempts=2) as engines:
        info = await engines.model_info()
    assert info.tokenizer_path == "/t" and info.weight_version == "2"
    assert info.context_length is None and info.owned_by == "sglang"
    assert info.pool_tokens is None


async def test_the_context_length_comes_from_v1_models_not_server_info(tiny_path: Path) -> None:
    """On servers verl launches, sglang's `/server_info` answers 500 (tests/sglang.py says why); its
    `/v1/models` card carries `max_model_len`. The gateway starts in front of such a server."""
    sglang = SglangStandIn(tiny_path, context_len=4096)
    with sglang.served() as url:
        assert httpx.get(url + "/server_info").status_code == 500
        async with client([url], attempts=1) as engines:
            info = await engines.model_info()
    assert info.pool_tokens == sglang.pool_tokens  # `/v1/loads`' max_total_num_tokens
    assert (
        info.context_length == 4096
        and info.owned_by == "sglang"
        and info.tokenizer_path == str(tiny_path)
    )
    assert "/server_info" not in sglang.log.paths()[1:]


async def test_an_aborted_generation_raises_and_returns_nothing(tiny_path: Path) -> None:
    """sglang answers an abort with a 200, `finish_reason {"type": "abort"}` and the partial output."""
    sglang = SglangStandIn(tiny_path, [Reply("one two three four", abort_after=2)])
    with sglang.served() as url:
        async with client([url], attempts=1) as engines:
            with pytest.raises(EngineAborted, match="aborted"):
                await engines.generate([1, 2, 3], {"max_new_tokens": 16})
    assert sglang.log.paths() == ["/generate"]  # not retried: the harness retries the call


# ---------------------------------------------------------------------------- streams left early

LONG = "word " * 1000  # about 600 tokens: 6 s at 10 ms a token


def generated(sglang: SglangStandIn) -> list[dict[str, Any]]:
    """The bodies of the `/generate` requests the stand-in received."""
    return [body for path, body in sglang.log.requests if path == "/generate"]


def aborts(sglang: SglangStandIn) -> list[str]:
    """The rids the stand-in was asked to abort."""
    return [body["rid"] for path, body in sglang.log.requests if path == "/abort_request"]


async def read_pieces(engines: EngineClient, count: int) -> None:
    """A stream read for `count` pieces, then left (the loop broken: a stop string, a harness)."""
    pieces = engines.stream([1, 2, 3], {"max_new_tokens": 1500})
    async with contextlib.aclosing(pieces):
        async for _ in pieces:
            count -= 1
            if count == 0:
                break


@pytest.mark.parametrize("how", ["broken", "cancelled"])
async def test_a_stream_left_early_is_aborted_by_its_rid_and_read_to_its_end(
    tiny_path: Path, how: str
) -> None:
    """Left after 3 pieces (its loop broken, or its task cancelled as when a harness goes), the
    stream's generation is aborted by its rid, and the engine no longer runs it once the stream has
    closed: sglang would abort it only 2 s later, and dies on a weight update before that. The
    connection then serves the next request."""
    sglang = SglangStandIn(tiny_path, [LONG, "Hi."], token_delay_s=0.01)
    with sglang.served() as url:
        async with client([url], attempts=1) as engines:
            if how == "broken":
                await read_pieces(engines, 3)
            else:
                reading = asyncio.create_task(read_pieces(engines, 1000))
                while not sglang.running:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                reading.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await reading
            idle_at_close = sglang.idle()
            after = await engines.generate([1, 2, 3], {"max_new_tokens": 16})
            inflight = engines.replicas[0].inflight
    (first, _) = generated(sglang)
    assert idle_at_close and aborts(sglang) == [first["rid"]]
    assert after.finish_reason == "stop" and inflight == 0
    assert sglang.died is None


async def test_a_stream_past_its_time_limit_is_aborted_and_unavailable(tiny_path: Path) -> None:
    """`timeout_s` bounds a whole generation: past it the stream fails as unavailable, and its
    generation is aborted first."""
    sglang = SglangStandIn(tiny_path, [LONG], token_delay_s=0.01)
    with sglang.served() as url:
        async with client([url], attempts=1, timeout_s=0.3) as engines:
            with pytest.raises(EngineUnavailable, match=r"no whole generation within 0\.3 s"):
                await read_pieces(engines, 1000)
            idle = sglang.idle()
    assert idle and aborts(sglang) == [generated(sglang)[0]["rid"]]


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_prompt_at_the_context_edge_is_rejected_and_not_retried(
    tiny_path: Path, streamed: bool
) -> None:
    """sglang aborts a prompt of `min(C - 1, pool - 1) - 5` tokens or more with status 400 (in a
    stream, a 200 whose chunk says so): a rejection, not a generation to retry."""
    sglang = SglangStandIn(tiny_path, context_len=64)
    prompt = [5] * (63 - 5)
    with sglang.served() as url:
        async with client([url], attempts=3) as engines:
            with pytest.raises(EngineRejected, match="exceeds the maximum allowed length"):
                if streamed:
                    async for _ in engines.stream(prompt, {"max_new_tokens": 1}):
                        pass
                else:
                    await engines.generate(prompt, {"max_new_tokens": 1})
    assert len(generated(sglang)) == 1 and aborts(sglang) == []


async def test_an_abort_in_the_waiting_queue_is_an_abort_not_a_malformed_chunk(
    tiny_path: Path,
) -> None:
    """A request retracted to the waiting queue after 5 tokens and aborted there (sglang's waiting
    time-out) ends with a chunk of only its last id while the client has seen 1 (`--stream-interval
    8`): an abort the harness may retry."""
    script = [Reply(LONG, retract_after=5)]
    sglang = SglangStandIn(
        tiny_path, script, incremental=True, stream_interval=8, waiting_timeout_s=0.1
    )
    with sglang.served() as url:
        async with client([url], attempts=1) as engines:
            with pytest.raises(EngineAborted, match="Request waiting timeout reached"):
                await read_pieces(engines, 1000)
    assert aborts(sglang) == []  # its last chunk came: nothing runs to abort


async def test_a_kept_connection_closed_unanswered_is_resent_for_a_stream_too() -> None:
    """A streamed `/generate` on a kept connection the engine closed without a word (its keep-alive
    ran out) is sent again at once on a new one, and the replica is not taken for down."""
    chunk = {**sglang_reply([1]), "output_ids": [1, 2, 3]}
    body = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    stream = head + b"content-length: %d\r\n\r\n" % len(body) + body
    async with (
        raw_replica([stream, b"", stream]) as (url, connections),
        client([url], attempts=1) as engines,
    ):
        for _ in range(2):
            pieces = [p async for p in engines.stream([1], {})]
            assert [p.output_ids for p in pieces] == [[1, 2, 3]]
        down = engines.replicas[0].down_until
    assert down == 0.0 and len(connections) == 2
