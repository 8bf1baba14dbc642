"""The engine's tests share one embedded engine per module (the tiny model, batching up to 8), and
a few helpers: a short-context copy of the tiny model and polls of `/v1/loads`."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.batcher import Engine

SHORT_CONTEXT = 64  # tokens: prompts at the context's edge cost nothing to prefill


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> Iterator[Engine]:
    eng = Engine(tiny_path, max_batch=8)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def short_path(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a context of `SHORT_CONTEXT` tokens."""
    path = tmp_path_factory.mktemp("short") / "tiny-short"
    shutil.copytree(tiny_path, path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = SHORT_CONTEXT
    (path / "config.json").write_text(json.dumps(config))
    return path


async def loads_until(
    http: httpx.AsyncClient, running: int, waiting: int, timeout_s: float = 20
) -> dict[str, Any]:
    """Poll `/v1/loads` until its one entry counts `running` and `waiting` requests; that entry."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = (await http.get("/v1/loads")).json()["loads"][0]
        if (entry["num_running_reqs"], entry["num_waiting_reqs"]) == (running, waiting):
            return dict(entry)
        assert time.monotonic() < deadline, entry
        await asyncio.sleep(0.01)
