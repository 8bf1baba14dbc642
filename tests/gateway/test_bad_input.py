"""Bad input to the gateway: an error object in the caller's wire format with the right status,
never a 500, and nothing stored but an error event on the rollout when it is known."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.stack import Stack, stack

USER = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def s(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory):
    with stack(tiny_path, tmp_path_factory.mktemp("bad"), max_body_bytes=100_000) as s:
        yield s


CHAT_CASES = [
    ("malformed JSON", b"{not json", 400),
    ("not an object", b"[1, 2]", 400),
    ("lone surrogate", b'{"messages": [{"role": "user", "content": "a \\ud800 b"}]}', 400),
    (
        "NaN temperature",
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        400,
    ),
    ("wrong type", {"messages": "hello"}, 400),
    ("no messages", {"messages": []}, 400),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("bad content", {"messages": [{"role": "user", "content": 7}]}, 400),
    (
        "image content",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
    ),
    ("max_tokens zero", {"messages": USER, "max_tokens": 0}, 400),
    ("max_tokens huge", {"messages": USER, "max_tokens": 10**9}, 400),
    ("negative temperature", {"messages": USER, "temperature": -1}, 400),
    ("seed beyond 64 bits", {"messages": USER, "seed": 2**70}, 400),
    ("top_k beyond 32 bits", {"messages": USER, "top_k": 2**40}, 400),
    (
        "bad tool schema",
        {"messages": USER, "tools": [{"type": "function", "function": {"parameters": {}}}]},
        400,
    ),
    ("tools not a list", {"messages": USER, "tools": {"a": 1}}, 400),
    ("bad tool call", {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, 400),
    ("too large", {"messages": [{"role": "user", "content": "x" * 200_000}]}, 413),
    (
        "template variables not an object",
        {"messages": USER, "chat_template_kwargs": "enable_thinking"},
        400,
    ),
    (
        "a template as a variable",
        {"messages": USER, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
        400,
    ),
]


def _post(s: Stack, path: str, body: object, headers: dict[str, str]) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(
            s.url + path, content=body, headers=headers | {"content-type": "application/json"}
        )
    return httpx.post(s.url + path, json=body, headers=headers)


@pytest.mark.parametrize(("name", "body", "status"), CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_bad_chat_requests(s: Stack, name: str, body: object, status: int):
    r = s.rollout()
    reply = _post(s, "/v1/chat/completions", body, {"Authorization": f"Bearer {r['agent_token']}"})
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert s.admin.get(f"/api/rollouts/{r['id']}/calls").json() == []
    if status != 413:
        assert [e["kind"] for e in s.admin.get(f"/api/rollouts/{r['id']}/events").json()][
            -1
        ] == "error"


ANTHROPIC_CASES = [
    ("malformed JSON", b"{", 400),
    ("missing max_tokens", {"messages": USER}, 400),
    ("unknown role", {"max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]}, 400),
    (
        "unknown block",
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        400,
    ),
    ("too large", {"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 200_000}]}, 413),
    ("thinking not an object", {"max_tokens": 5, "messages": USER, "thinking": True}, 400),
    ("tool_choice not an object", {"max_tokens": 5, "messages": USER, "tool_choice": "any"}, 400),
]


@pytest.mark.parametrize(
    ("name", "body", "status"), ANTHROPIC_CASES, ids=[c[0] for c in ANTHROPIC_CASES]
)
def test_bad_anthropic_requests(s: Stack, name: str, body: object, status: int):
    r = s.rollout()
    reply = _post(s, "/v1/messages", body, {"x-api-key": r["agent_token"]})
    assert reply.status_code == status, reply.text
    assert reply.json()["type"] == "error" and reply.json()["error"]["message"]
    assert s.admin.get(f"/api/rollouts/{r['id']}/calls").json() == []


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"]
)
@pytest.mark.parametrize("token", ["", "unknown-token"])
def test_unknown_tokens(s: Stack, path: str, token: str):
    reply = httpx.post(
        s.url + path, json={"messages": USER, "max_tokens": 3}, headers={"x-api-key": token}
    )
    assert reply.status_code == 401
    body = reply.json()
    assert (
        (body["type"] == "error")
        if path == "/v1/messages"
        else (body["error"]["type"] == "authentication_error")
    )


def test_bad_admin_requests(s: Stack):
    cases = [
        s.admin.post("/api/rollouts", json={"group": ""}),
        s.admin.post("/api/rollouts", json={"group": "g", "mode": "exam"}),
        s.admin.post("/api/rollouts", json={"group": "g", "task": [1]}),
        s.admin.post("/api/rollouts", json={"group": "g", "surprise": 1}),
        s.admin.post("/api/rollouts", content=b"{"),
        s.admin.post("/api/models", json={"version": -1}),
        s.admin.post("/api/resume", json={"version": "x"}),
    ]
    assert [c.status_code for c in cases] == [400] * len(cases), [c.text for c in cases]
    r = s.rollout()
    assert (
        s.admin.post(f"/api/rollouts/{r['id']}/reward", json={"reward": "nan"}).status_code == 400
    )
    assert (
        s.admin.post(f"/api/rollouts/{r['id']}/status", json={"status": "exploded"}).status_code
        == 400
    )
    assert s.admin.post("/api/rollouts/missing/reward", json={"reward": 1}).status_code == 404
    assert s.admin.get(f"/api/rollouts/{r['id']}").json()["reward"] is None
