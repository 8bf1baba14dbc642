"""What one harness can take of the gateway (#25): connections, a request's head, a rollout's
storage; and the engine's own key, so that a harness on the same host cannot call the engine
around the gateway.

The connection limits are uvicorn's server settings, so they are tested on a real `agl gateway`
process (over bench/soak.py's instant engine stand-in); the rest on the tiny engine and an
in-process gateway. All real HTTP.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from bench.stack import running
from engine.batcher import Engine
from engine.server import create_app as engine_app
from tests.gateway.conftest import serve
from tests.gateway.stack import ADMIN, stack
from trainer.engines import DiskEngine, engine_http

USER = [{"role": "user", "content": "x"}]
HEAD_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    env = {"AGL_GATEWAY_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S), "AGL_GATEWAY_MAX_HEAD_BYTES": "8192"}
    with running(
        tmp_path_factory.mktemp("limits"), env | {"AGL_GATEWAY_MAX_CONNECTIONS": "20"}
    ) as s:
        host, port = s.url.removeprefix("http://").split(":")
        yield host, int(port)


def exchange(conn: socket.socket, request: bytes) -> bytes:
    """Sends `request` and reads what comes back until the reply's head is in, or the connection closes."""
    conn.sendall(request)
    got = b""
    while b"\r\n\r\n" not in got and (chunk := conn.recv(65536)):
        got += chunk
    return got


def closed_within(conn: socket.socket, seconds: float) -> bool:
    conn.settimeout(seconds)
    try:
        while conn.recv(65536):
            pass
        return True
    except ConnectionResetError:  # closed with unread data left: reset
        return True
    except TimeoutError:
        return False


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


def test_a_request_head_over_the_limit_is_refused(gateway: tuple[str, int]):
    """A 1 MB header was accepted and held in memory; now a head over `max_head_bytes` is a 400 and the
    connection closes before the rest is read. A head under it (4 KB of headers) is served."""
    with socket.create_connection(gateway, timeout=10) as conn:
        assert exchange(conn, HEALTHZ + b"x-pad: " + b"p" * 4096 + b"\r\n\r\n").startswith(
            b"HTTP/1.1 200"
        )
    with socket.create_connection(gateway, timeout=10) as conn:
        try:
            reply = exchange(conn, HEALTHZ + b"x-pad: " + b"p" * 1_000_000 + b"\r\n\r\n")
        except ConnectionResetError:
            # it closed while the rest was still being sent: refused all the same
            reply = b"HTTP/1.1 400"
        assert reply.startswith(b"HTTP/1.1 400") and closed_within(conn, 5)


def test_slow_heads_are_cut_off_and_idle_connections_are_kept(gateway: tuple[str, int]):
    """Slowloris: sockets that send nothing, or a head a few bytes at a time, stayed open for good;
    now a head must be complete within `head_timeout_s` of its first byte (or of the connection's
    opening). A harness's connection idle between calls (for longer than that) is kept alive, and
    serves its next call."""
    with socket.create_connection(gateway) as silent, socket.create_connection(gateway) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        for _ in range(3):
            time.sleep(HEAD_TIMEOUT_S / 3)
            slow.sendall(b"x-a: b\r\n")
        assert closed_within(silent, HEAD_TIMEOUT_S * 3) and closed_within(slow, HEAD_TIMEOUT_S * 3)
    with socket.create_connection(gateway, timeout=10) as kept:
        assert exchange(kept, HEALTHZ + b"\r\n").startswith(b"HTTP/1.1 200")
        assert not closed_within(kept, HEAD_TIMEOUT_S * 2)  # idle after a reply: kept
        kept.settimeout(10)
        assert exchange(kept, HEALTHZ + b"\r\n").startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")  # a new head begun and never finished: cut off
        assert closed_within(kept, HEAD_TIMEOUT_S * 3)


def test_connections_past_the_cap_get_503_until_some_close(gateway: tuple[str, int]):
    """`max_connections` bounds what open sockets can cost: past it, requests are answered 503 (retried by
    harnesses' SDKs), and served again once connections close."""
    idle = [socket.create_connection(gateway) for _ in range(20)]
    try:
        with socket.create_connection(gateway, timeout=10) as conn:
            assert exchange(conn, HEALTHZ + b"\r\n").startswith(b"HTTP/1.1 503")
    finally:
        for conn in idle:
            conn.close()
    time.sleep(0.5)
    with socket.create_connection(gateway, timeout=10) as conn:
        assert exchange(conn, HEALTHZ + b"\r\n").startswith(b"HTTP/1.1 200")


def test_a_rollout_past_its_storage_budget_is_refused_with_nothing_stored(
    tiny_path: Path, tmp_path: Path
):
    """One call stored a 25 MB request and a 30 MB event was accepted; now the bodies a rollout's
    tokens send count against `rollout_max_bytes`, and past it a call or event is a 413 in the
    client's own format, stores nothing, and is counted in /metrics. The admin's events are not
    counted. After a restart the count starts from the store's: the bodies of the requests it
    recorded (the five calls, about 20.5 KB of the 33 KB sent; the refused ones recorded nothing)."""
    budget, pad = 30_000, "y" * 4_000
    with stack(tiny_path, tmp_path, rollout_max_bytes=budget) as s:
        r, other = s.rollout(), s.rollout()
        oa = s.openai_client(r["agent_token"], max_retries=0)
        for _ in range(5):  # about 20 KB of the 30 KB
            oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": pad}], max_tokens=1
            )
        with pytest.raises(openai.APIStatusError) as refused:
            oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": pad * 3}], max_tokens=1
            )
        assert (
            refused.value.status_code == 413 and "storage budget of 30000" in refused.value.message
        )
        ant = s.anthropic_client(r["agent_token"], max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as refused_too:
            ant.messages.create(
                model="m", messages=[{"role": "user", "content": pad * 3}], max_tokens=1
            )
        assert (
            refused_too.value.status_code == 413
            and refused_too.value.body["error"]["type"] == "request_too_large"
        )
        token = {"Authorization": f"Bearer {r['agent_token']}"}
        event = {"kind": "note", "data": {"x": pad * 3}}
        assert (
            httpx.post(
                f"{s.url}/api/rollouts/{r['id']}/events", headers=token, json=event
            ).status_code
            == 413
        )
        # not counted
        assert s.admin.post(f"/api/rollouts/{r['id']}/events", json=event).status_code == 200
        assert len(s.store.calls_for([r["id"]])[r["id"]]) == 5
        assert not [
            e for e in s.store.events(r["id"]) if e.kind == "note" and e.data != event["data"]
        ]
        oa_other = s.openai_client(other["agent_token"], max_retries=0)
        oa_other.chat.completions.create(
            model="m", messages=[{"role": "user", "content": pad * 3}], max_tokens=1
        )
        metrics = httpx.get(s.url + "/metrics").text
        assert "agl_over_budget_total 3.0" in metrics
    with stack(
        tiny_path, tmp_path, rollout_max_bytes=50_000
    ) as s:  # a restart, on the same database
        oa = s.openai_client(r["agent_token"], max_retries=0)
        seed = s.store.sent_bytes(r["id"])
        assert 20_000 < seed < 21_000
        with pytest.raises(openai.APIStatusError, match=f"has sent {seed} bytes"):
            oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": pad * 9}], max_tokens=1
            )
        # what is left still serves
        oa.chat.completions.create(model="m", messages=USER, max_tokens=1)


def test_the_engine_key_keeps_everyone_but_its_clients_out(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The embedded engine answered anyone on the host, harnesses included. With `--api-key` it
    answers only `Authorization: Bearer <key>` (but `/health`); the gateway (`engine_key`) and the
    trainer (the engine's own `AGL_ENGINE_API_KEY`) send it."""
    engine = Engine(tiny_path)
    try:
        with serve(engine_app(engine, api_key="engine-secret")) as url:
            generate = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
            assert httpx.post(url + "/generate", json=generate).status_code == 401
            assert (
                httpx.get(
                    url + "/model_info", headers={"Authorization": "Bearer wrong"}
                ).status_code
                == 401
            )
            assert httpx.get(url + "/health").status_code == 200
            monkeypatch.setenv("AGL_ENGINE_API_KEY", "engine-secret")
            with engine_http(10) as http:
                assert http.post(url + "/generate", json=generate).status_code == 200
            trainer = DiskEngine(url, tmp_path, lambda _: None)  # the trainer's calls carry it
            trainer.sleep()
            trainer.wake()
            trainer.close()
    finally:
        engine.close()


def test_the_gateway_sends_the_engine_key(tiny_path: Path, tmp_path: Path):
    """The gateway's engine client sends `engine_key`; harnesses cannot reach the engine without it."""
    with stack(tiny_path, tmp_path, engine_key="engine-secret") as s:
        r = s.rollout()
        reply = httpx.post(
            s.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {r['agent_token']}"},
            json={"messages": USER, "max_tokens": 2},
        )
        assert reply.status_code == 200, reply.text
        assert httpx.post(s.engine_url + "/generate", json={"input_ids": [1]}).status_code == 401
        assert ADMIN not in reply.text
