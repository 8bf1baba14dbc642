"""What a harness cannot reach: other rollouts, the admin API, expired tokens, oversized bodies;
and what the store keeps of credentials (hashes only). Real gateway, store and tiny engine."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from bench import soak
from gateway.metrics import MAX_LABELS
from gateway.proxy import INLINE_CHARS
from gateway.render import Renderer
from tests.gateway.stack import ADMIN, Stack, stack

USER = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def s(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory):
    with stack(tiny_path, tmp_path_factory.mktemp("security"), max_body_bytes=50_000) as s:
        yield s


def chat(s: Stack, token: str) -> httpx.Response:
    return httpx.post(
        s.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={"messages": USER, "max_tokens": 2},
        timeout=60,
    )


def test_every_cross_rollout_attempt_is_rejected(s: Stack):
    """Agent and grader tokens of one rollout against every rollout-scoped route of another and
    every admin route, as a header and as a /r/{token} path: all rejected, nothing changed."""
    out = asyncio.run(soak.cross_rollout(s.url, 3, {"Authorization": f"Bearer {ADMIN}"}))
    assert out["attempts"] == 3 * 2 * 2 * (len(soak.ROLLOUT_ROUTES) + 5)
    assert out["accepted"] == 0 and out["rejected"] == out["attempts"]


def test_only_token_hashes_reach_the_database(s: Stack):
    made = [s.rollout(grader=True) for _ in range(3)]
    rotated = s.admin.post(f"/api/rollouts/{made[0]['id']}/tokens").json()
    assert chat(s, rotated["agent_token"]).status_code == 200
    s.store.close()  # nothing left queued: every write is in the files
    s.store.__init__(s.store.url)  # type: ignore[misc]  # reopened for the tests that follow
    files = list(Path(s.store.url.removeprefix("sqlite:///")).parent.glob("gateway.db*"))
    raw = b"".join(f.read_bytes() for f in files)
    for creds in [*made, rotated]:
        for token in (creds["agent_token"], creds["grader_token"]):
            assert token.encode() not in raw and token.split(".", 1)[1].encode() not in raw


def test_tokens_expire(s: Stack):
    """Tokens carry their expiry, covered by the stored hash: an expired one is refused, and one
    whose expiry was moved is unknown."""
    issued = s.rollout()["agent_token"]
    expires = int(issued.split(".", 1)[0])
    assert abs(expires - (time.time() + 7 * 86400)) < 60  # the gateway's default lifetime
    old = s.store.create_rollout({}, "g", grader=True, token_ttl_s=-1).result()
    for token in (old.agent_token, old.grader_token):
        assert token is not None
        reply = chat(s, token)
        assert reply.status_code == 401 and "expired" in reply.json()["error"]["message"]
        reward = httpx.post(
            f"{s.url}/api/rollouts/{old.rollout.id}/reward",
            headers={"x-api-key": token},
            json={"reward": 1},
        )
        assert reward.status_code == 401
    moved = str(int(time.time()) + 3600) + "." + old.agent_token.split(".", 1)[1]
    reply = chat(s, moved)
    assert reply.status_code == 401 and reply.json()["error"]["message"] == "invalid API key"


def test_malformed_credentials_are_refused_not_a_server_error(s: Stack):
    """Non-ASCII keys (hmac.compare_digest takes only ASCII str) and expiry parts `int()` cannot read
    (`²` is a digit to Python; 5,000 digits exceed its limit) used to be 500s, with a traceback logged."""
    rid = s.rollout()["id"]
    keys = [
        "ü".encode("latin-1"),
        "².abc".encode(),
        ("9" * 5000 + ".abc").encode(),
        "ab\u00ffc".encode("latin-1"),
    ]
    for key in keys:
        for header in (b"Authorization", b"x-api-key"):
            value = b"Bearer " + key if header == b"Authorization" else key
            for method, path in [
                ("POST", "/v1/chat/completions"),
                ("GET", "/api/state"),
                ("POST", f"/api/rollouts/{rid}/reward"),
            ]:
                reply = httpx.request(
                    method,
                    s.url + path,
                    headers={header: value},
                    json={"reward": 1, "messages": USER},
                )
                assert reply.status_code in (401, 403), (
                    key[:20],
                    header,
                    path,
                    reply.status_code,
                    reply.text[:200],
                )
    path_token = httpx.get(s.url + "/r/%C2%B2.x/api/state")
    assert path_token.status_code in (401, 403)
    # credentials before validation
    assert httpx.get(s.url + "/api/rollouts?limit=abc").status_code == 401
    assert s.admin.get(f"/api/rollouts/{rid}").json()["reward"] is None


def test_a_refused_token_writes_nothing(s: Stack):
    """An ended rollout's agent token, and a grader token, calling the model: 403s that used to append an
    `error` event each (300 requests, 300 events)."""
    made = s.rollout(grader=True)
    assert chat(s, made["agent_token"]).status_code == 200
    s.admin.post(
        f"/api/rollouts/{made['id']}/status", json={"status": "cancelled"}
    ).raise_for_status()
    before = s.admin.get(f"/api/rollouts/{made['id']}/events").json()
    for token in (made["agent_token"], made["grader_token"]) * 5:
        assert chat(s, token).status_code == 403
    assert s.admin.get(f"/api/rollouts/{made['id']}/events").json() == before
    live = s.rollout(grader=True)
    assert chat(s, live["grader_token"]).status_code == 403
    assert [e["kind"] for e in s.admin.get(f"/api/rollouts/{live['id']}/events").json()] == [
        "lifecycle"
    ]


def test_events_that_steer_the_reward_or_forge_agl_s_records_are_reserved(s: Stack):
    """On a rollout with a grader, the agent may not post `flag` or `swe_patch` (the SWE grader's;
    the evaluation takes the last `swe_patch`); no token may post agl's own kinds (`lifecycle`,
    `launch`, ...)."""

    def post(rid: str, token: str, kind: str) -> int:
        url = f"{s.url}/api/rollouts/{rid}/events"
        return httpx.post(
            url, headers={"Authorization": f"Bearer {token}"}, json={"kind": kind}
        ).status_code

    graded, plain = s.rollout(grader=True), s.rollout()
    assert [
        post(graded["id"], graded["agent_token"], k) for k in ("flag", "swe_patch", "note")
    ] == [403, 403, 200]
    assert [post(graded["id"], graded["grader_token"], k) for k in ("flag", "swe_patch")] == [
        200,
        200,
    ]
    assert post(plain["id"], plain["agent_token"], "flag") == 200  # no grader: the harness reports
    for kind in ("lifecycle", "launch", "tokens", "reward", "error", "not_honoured"):
        assert post(graded["id"], graded["grader_token"], kind) == 403
        assert post(plain["id"], plain["agent_token"], kind) == 403
    assert post(plain["id"], ADMIN, "launch") == 200
    kinds = [e["kind"] for e in s.admin.get(f"/api/rollouts/{graded['id']}/events").json()]
    assert kinds == ["lifecycle", "note", "flag", "swe_patch"]


def test_a_chunked_body_over_the_limit_is_cut_off(s: Stack):
    """No Content-Length to check up front: the body is counted as it arrives."""
    r = s.rollout()

    def chunks():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}]}'

    reply = httpx.post(
        s.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {r['agent_token']}", "content-type": "application/json"},
        content=chunks(),
    )
    assert reply.status_code == 413 and "limit" in reply.json()["error"]["message"]
    assert s.admin.get(f"/api/rollouts/{r['id']}/calls").json() == []
    assert chat(s, r["agent_token"]).status_code == 200  # the gateway serves on


def test_a_prompt_no_context_can_hold_is_refused_before_it_is_tokenized(
    tiny_path: Path, tmp_path: Path
):
    """No token is longer than the vocabulary's longest entry, so past `context x longest` characters the
    prompt cannot fit: refused without tokenizing (30 MB took 13-22 s and 5 GB). Shorter, it is counted."""
    longest = max(map(len, AutoTokenizer.from_pretrained(tiny_path).get_vocab()))
    with stack(tiny_path, tmp_path, context_length=256) as small:
        r = small.rollout()

        def ask(chars: int, api: str = "chat/completions") -> dict:
            body = (
                {"prompt": "x" * chars}
                if api == "completions"
                else {"messages": [{"role": "user", "content": "x" * chars}]}
            )
            reply = httpx.post(
                f"{small.url}/v1/{api}",
                headers={"Authorization": f"Bearer {r['agent_token']}"},
                json=body,
            )
            assert reply.status_code == 400
            return reply.json()["error"]

        for api in ("chat/completions", "completions"):
            refused = ask(256 * longest + 1, api)
            assert (
                refused["code"] == "context_length_exceeded" and "characters" in refused["message"]
            )
        # fits the character bound: tokenized, then over the context
        counted = ask(256 * longest // 2)
        assert (
            counted["code"] == "context_length_exceeded" and "characters" not in counted["message"]
        )


def test_long_prompts_are_rendered_off_the_event_loop(s: Stack, monkeypatch: pytest.MonkeyPatch):
    """Rendering and tokenizing a long prompt takes seconds: on the event loop, every other call would wait.
    A short one (under `INLINE_CHARS`) is rendered on the loop, sparing two thread switches."""
    on_loop = []
    render = Renderer.prompt

    def spy(self: Renderer, *args: Any, **kwargs: Any) -> Any:
        try:
            on_loop.append(asyncio.get_running_loop() is not None)
        except RuntimeError:  # no loop runs in this thread
            on_loop.append(False)
        return render(self, *args, **kwargs)

    monkeypatch.setattr(Renderer, "prompt", spy)
    token = s.rollout()["agent_token"]
    assert chat(s, token).status_code == 200
    long = [{"role": "user", "content": "word " * (INLINE_CHARS // 5)}]
    headers = {"Authorization": f"Bearer {token}"}
    reply = httpx.post(
        s.url + "/v1/chat/completions",
        headers=headers,
        json={"messages": long, "max_tokens": 2},
        timeout=60,
    )
    assert reply.status_code == 200 and on_loop == [True, False]


def test_deep_json_is_refused_before_sampling(s: Stack):
    """Past 1,024 levels the standard library's parser overflowed (a 500); about 1,000 levels in an
    ignored field were sampled, then could not be stored with the call. Both are a 400 now, and
    nothing is recorded."""
    r = s.rollout()
    for depth in (2_000, 1_000, 65):
        raw = (
            '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "extra": '
            + "[" * depth
        )
        reply = httpx.post(
            s.url + "/v1/chat/completions",
            headers={
                "Authorization": f"Bearer {r['agent_token']}",
                "content-type": "application/json",
            },
            content=raw + "]" * depth + "}",
        )
        message = reply.json()["error"]["message"]
        assert reply.status_code == 400 and (
            "not valid JSON" in message or "deeper than 64" in message
        ), message
    assert s.admin.get(f"/api/rollouts/{r['id']}/calls").json() == []
    assert chat(s, r["agent_token"]).status_code == 200  # a body of ordinary depth is served


def test_agent_names_are_bounded_in_the_store_and_in_metrics(s: Stack):
    """A harness names its agent (`x-agl-agent`, else `model`): NUL bytes and 100 KB names were a
    metric label each, forever; now they are refused, and past 100 distinct names the label is
    `other`."""
    r = s.rollout()

    def call(agent: str) -> int:
        body = {"model": agent, "messages": USER, "max_tokens": 1}
        headers = {"Authorization": f"Bearer {r['agent_token']}"}
        return httpx.post(s.url + "/v1/chat/completions", headers=headers, json=body).status_code

    assert [call("a\x00b"), call("x" * 256), call("line\nbreak")] == [400, 400, 400]
    assert [call(f"agent-{i}") for i in range(120)] == [200] * 120
    metrics = httpx.get(s.url + "/metrics").text
    labels = {
        line.split('agent="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("agl_calls_total")
    }
    # the cap, and other
    assert len(labels) == MAX_LABELS + 1 and "other" in labels and "\x00" not in metrics


def test_nul_characters_are_refused_alike_on_every_database(s: Stack):
    """PostgreSQL's text columns refuse NUL (a 500 there, after the engine had sampled), where
    SQLite stored it: refused up front now, on both, for every text that reaches a column. The fuzz
    test runs on both."""
    r = s.rollout()
    agent = {"Authorization": f"Bearer {r['agent_token']}"}
    replies = [
        s.admin.post("/api/rollouts", json={"group": "g\x00"}),
        s.admin.get("/api/rollouts", params={"group": "g\x00"}),
        s.admin.get(f"/api/rollouts/{r['id']}%00"),
        s.admin.post("/api/models", json={"version": 1, "path": "/ckpt\x00"}),
        s.admin.post(
            f"/api/rollouts/{r['id']}/status", json={"status": "running", "reason": "x\x00"}
        ),
        httpx.post(f"{s.url}/api/rollouts/{r['id']}/events", headers=agent, json={"kind": "k\x00"}),
    ]
    # the status was not set
    assert s.admin.get(f"/api/rollouts/{r['id']}").json()["status"] == "queued"
    replies.append(
        httpx.post(
            f"{s.url}/v1/chat/completions", headers=agent, json={"model": "m\x00", "messages": USER}
        )
    )
    assert [reply.status_code for reply in replies] == [400] * len(replies), [
        reply.text for reply in replies
    ]
    assert s.admin.get("/api/state").json()["latest_model"] is None
    assert [e["kind"] for e in s.admin.get(f"/api/rollouts/{r['id']}/events").json()] == [
        "lifecycle"
    ] * 2 + ["error"]


def test_an_unexpected_error_is_a_500_that_keeps_the_connection(
    s: Stack, monkeypatch: pytest.MonkeyPatch
):
    """A bug answers 500 with no details, and the harness's kept-alive connection serves its next request.
    Any exception: a library's own error class, not only the builtin ones."""

    class LibraryError(Exception):
        pass

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise LibraryError("a bug")

    r = s.rollout()
    monkeypatch.setattr(s.store, "events", broken)
    host, port = s.url.removeprefix("http://").split(":")
    request = (
        f"GET /api/rollouts/{r['id']}/events HTTP/1.1\r\n"
        f"Host: x\r\nAuthorization: Bearer {ADMIN}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        replies = []
        for _ in range(2):
            conn.sendall(request.encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            replies.append((head.split(b" ")[1], json.loads(body)))
    # the second on the same connection
    assert [status for status, _ in replies] == [
        b"500",
        b"500",
    ]
    assert "a bug" not in str(replies) and replies[0][1]["error"]["message"] == "internal error"
