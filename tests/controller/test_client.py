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
            assert [r.id for r in await gw.list_rollouts(status=Status.QUEUED, group="grp")] == [made["id"]]
            fresh = await gw.rotate_tokens(made["id"], attempt=1)
            assert fresh["agent_token"] != made["agent_token"] and fresh["grader_token"] != made["grader_token"]
            async with httpx.AsyncClient(base_url=gateway.url) as raw:
                for token, code in [(made["agent_token"], 401), (fresh["agent_token"], 200)]:
                    reply = await raw.get(f"/api/rollouts/{made['id']}", headers={"Authorization": f"Bearer {token}"})
                    assert reply.status_code == code
            await gw.set_status(made["id"], Status.RUNNING, attempt=1)
            retried = await gw.set_status(made["id"], Status.QUEUED, failure_kind=FailureKind.INFRA, attempt=1)
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
