"""The gateway admin client (agl/client.py) and the token rotation it relies on, against a real gateway."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agl.client import GatewayClient, GatewayError
from agl.types import FailureKind, Status
from tests.gateway.stack import ADMIN


def test_client_round_trip_and_errors(gateway) -> None:
    async def run() -> None:
        async with GatewayClient(gateway.url, ADMIN) as gw:
            made = await gw.create_rollout({"q": 2}, "grp", grader=True, metadata={"k": "v"})
            assert made["grader_token"] and made["base_url"] == gateway.url + "/v1"
            rollout = await gw.get_rollout(made["id"])
            assert (rollout.status, rollout.has_grader, rollout.metadata) == (
                Status.QUEUED,
                True,
                {"k": "v", "grader": True},
            )
            assert [r.id for r in await gw.list_rollouts(status=Status.QUEUED, group="grp")] == [
                made["id"]
            ]
            fresh = await gw.rotate_tokens(made["id"], attempt=1)
            assert (
                fresh["agent_token"] != made["agent_token"]
                and fresh["grader_token"] != made["grader_token"]
            )
            async with httpx.AsyncClient(base_url=gateway.url) as raw:
                for token, code in [(made["agent_token"], 401), (fresh["agent_token"], 200)]:
                    reply = await raw.get(
                        f"/api/rollouts/{made['id']}", headers={"Authorization": f"Bearer {token}"}
                    )
                    assert reply.status_code == code
            await gw.set_status(made["id"], Status.RUNNING, attempt=1)
            retried = await gw.set_status(
                made["id"], Status.QUEUED, failure_kind=FailureKind.INFRA, attempt=1
            )
            assert retried.attempt == 2
            with pytest.raises(GatewayError) as stale:
                await gw.rotate_tokens(made["id"], attempt=1)
            assert stale.value.status == 409
            with pytest.raises(GatewayError) as missing:
                await gw.get_rollout("nope")
            assert missing.value.status == 404
            await gw.set_status(made["id"], Status.CANCELLED)
            with pytest.raises(GatewayError, match="409"):
                await gw.rotate_tokens(made["id"])
        async with GatewayClient("http://127.0.0.1:9", ADMIN, timeout_s=2) as down:
            with pytest.raises(GatewayError) as unreachable:
                await down.list_rollouts()
            assert unreachable.value.status == 0

    asyncio.run(run())


def test_an_idle_connection_is_not_reused_after_a_server_may_have_closed_it() -> None:
    """A server closes a connection idle for its keep-alive time (uvicorn: 5 s); when that close crosses a
    request going out on it, the request fails ("Server disconnected"), as it did to the trainer's model
    registration in CI. This server answers once per connection and drops the connection when a second
    request comes on it: a request after 4.5 s idle must go out on a new connection (aiohttp retries a GET
    on a new one by itself, never a POST)."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for answered in range(2):
            await reader.readuntil(b"\r\n\r\n")
            if answered:
                break  # the keep-alive timer fired as this request came in
            body = b'{"version": 0}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % len(body)
            )
            writer.write(body)
            await writer.drain()
        writer.close()

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server, GatewayClient(url, ADMIN) as gw:
            assert await gw._request("POST", "/api/models") == {"version": 0}
            await asyncio.sleep(4.5)
            assert await gw._request("POST", "/api/models") == {"version": 0}
        assert connections == 2

    asyncio.run(run())
