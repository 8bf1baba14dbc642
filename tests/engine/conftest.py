"""The engine's tests share one embedded engine per module: the tiny model, batching up to 8."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.batcher import Engine


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> Iterator[Engine]:
    eng = Engine(tiny_path, max_batch=8)
    yield eng
    eng.close()
