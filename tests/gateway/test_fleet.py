"""A gateway among its replicas, alone: on a store that serves one gateway process (SQLite) there
is no other gateway to follow. Replicas over PostgreSQL are tested in test_replicas.py."""

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agl.store import Store
from gateway.fleet import SYNC_S, Replicas
from gateway.types import Peers


def test_a_gateway_alone_on_a_sqlite_store_reads_the_fleet_only_when_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody else can change the fleet's row, or join: the gateway reads it when it starts, not
    every `SYNC_S` (ten reads a second were 12 of an idle gateway's 16 ms of CPU a second)."""
    with Store(f"sqlite:///{tmp_path}/agl.db") as store:
        reads = []
        fleet = store.fleet_and_peers

        def counted(*args: Any, **kwargs: Any) -> Any:
            reads.append(1)
            return fleet(*args, **kwargs)

        monkeypatch.setattr(store, "fleet_and_peers", counted)
        proxy: Any = SimpleNamespace(
            id="g", serve_version=lambda version: None, gate=SimpleNamespace(paused=False)
        )

        async def serve_a_while() -> None:
            replicas = Replicas(store, proxy, Peers(), address="127.0.0.1:0")
            await replicas.join()
            await asyncio.sleep(5 * SYNC_S)
            await replicas.leave()

        asyncio.run(serve_a_while())
    assert len(reads) == 1
