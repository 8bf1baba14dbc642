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

from gateway.engines import (
    EngineAborted,
    EngineClient,
    EngineError,
    EngineRejected,
    EngineUnavailable,
    TransportError,
)
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
    url, s = stand_ins[0]
    s.script = [(200, None, 1.5)] * 2
    start = time.monotonic()
    async with client([url], attempts=2, timeout_s=0.2) as engines:
        with pytest.raises(EngineUnavailable) as e:
            await engines.generate([1], {})
    assert time.monotonic() - start < 1.2
    assert isinstance(e.value.__cause__, TimeoutError) and len(s.requests) == 2


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
    async with client([dead_url(), url], attempts=2) as engines:
        info = await engines.model_info()
    assert info.tokenizer_path == "/t" and info.weight_version == "2"
    assert info.context_length is None and info.owned_by == "sglang"


async def test_the_context_length_comes_from_v1_models_not_server_info(tiny_path: Path) -> None:
    """On servers verl launches, sglang's `/server_info` answers 500 (tests/sglang.py says why); its
    `/v1/models` card carries `max_model_len`. The gateway starts in front of such a server."""
    sglang = SglangStandIn(tiny_path, context_len=4096)
    with serve(sglang.app()) as url:
        assert httpx.get(url + "/server_info").status_code == 500
        async with client([url], attempts=1) as engines:
            info = await engines.model_info()
    assert (
        info.context_length == 4096
        and info.owned_by == "sglang"
        and info.tokenizer_path == str(tiny_path)
    )
    assert "/server_info" not in sglang.log.paths()[1:]


async def test_an_aborted_generation_raises_and_returns_nothing(tiny_path: Path) -> None:
    """sglang answers an abort with a 200, `finish_reason {"type": "abort"}` and the partial output."""
    sglang = SglangStandIn(tiny_path, [Reply("one two three four", abort_after=2)])
    with serve(sglang.app()) as url:
        async with client([url], attempts=1) as engines:
            with pytest.raises(EngineAborted, match="aborted"):
                await engines.generate([1, 2, 3], {"max_new_tokens": 16})
    assert sglang.log.paths() == ["/generate"]  # not retried: the harness retries the call
