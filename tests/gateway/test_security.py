"""What a harness cannot reach: other rollouts, the admin API, expired tokens, oversized bodies;
and what the store keeps of credentials (hashes only). Real gateway, store and tiny engine."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.gateway.stack import Stack, stack

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
    )


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
