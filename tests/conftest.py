"""Shared fixtures: one thread per math library, offline model hub, store URLs and the tiny model.

`db_url` runs a test against SQLite and, when AGL_TEST_POSTGRES_URL names a server (CI always
does), against a fresh PostgreSQL database created for that test and dropped after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from bench.postgres import database

POSTGRES_URL = os.environ.get("AGL_TEST_POSTGRES_URL", "")


def _postgres_database() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("AGL_TEST_POSTGRES_URL is not set")
    with database(POSTGRES_URL, prefix="agl_test") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'agl.db'}"
    else:
        yield from _postgres_database()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database (skips without AGL_TEST_POSTGRES_URL)."""
    yield from _postgres_database()


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's Hugging Face folder, built once per test session."""
    from engine import models

    return models.resolve("tiny", tmp_path_factory.mktemp("models"))
