"""Fixtures for the SWE recipe's tests: the toy task as a git repository in SWE-smith's layout,
the recipe's spec pointed at this checkout, and rollouts run by a real controller."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agl.client import GatewayClient
from controller.launcher import Launcher
from examples.swe.spec import SpecSettings, create_rollouts
from examples.swe.tasks import Task
from tests.controller.conftest import controller, wait_status
from tests.gateway.stack import ADMIN, Stack, stack

collect_ignore_glob = ["toy/*"]  # the toy task's own tests run only inside the recipe
HERE = Path(__file__).parent
RECIPE = HERE.parents[2] / "examples" / "swe"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
GIT += ["-c", "init.defaultBranch=main"]


@pytest.fixture
def toy(tmp_path: Path) -> tuple[Path, Task]:
    """The toy repository: the original code and tests on `main`, the task's bug on the branch
    named like the instance (SWE-smith's layout); and its task record."""
    record = json.loads((HERE / "toy" / "task.json").read_text())
    source = tmp_path / "source"
    shutil.copytree(HERE / "toy", source, ignore=shutil.ignore_patterns("task.json", "__pycache__"))

    def run(*argv: str, **kw: Any) -> None:
        subprocess.run([*GIT, *argv], cwd=source, check=True, capture_output=True, **kw)

    run("init", "-q")
    run("add", "-A")
    run("commit", "-q", "-m", "original")
    run("checkout", "-q", "-b", record["instance_id"])
    run("apply", "-", input=record["patch"].encode())
    run("commit", "-q", "-am", "Bug Patch")
    run("checkout", "-q", "main")
    return source, Task.from_record(record)


def local_settings(source: Path, **fields: Any) -> SpecSettings:
    """The recipe's spec for this machine: this checkout, this venv, the toy repository."""
    defaults: dict[str, Any] = dict(
        python=sys.executable, grader_python=sys.executable, recipe_dir=str(RECIPE), source=str(source),
        repo="repo", grade_repo="grade", step_limit=8, harness_timeout_s=240, grader_timeout_s=120,
        test_timeout_s=60, cpu=None, memory=None, max_attempts=1,
    )  # fmt: skip
    return SpecSettings(**(defaults | fields))


def create(
    s: Stack, tasks: list[Task], settings: SpecSettings, k: int = 1, prefix: str = "swe-"
) -> list[str]:
    async def go() -> list[str]:
        async with GatewayClient(s.url, ADMIN) as gw:
            return await create_rollouts(gw, tasks, settings, k=k, prefix=prefix, mode="train")

    return asyncio.run(go())


@contextmanager
def recipe_stack(
    tiny: Path,
    tmp_path: Path,
    script: list[str],
    runner: Launcher | None = None,
    **controller_fields: Any,
) -> Iterator[Stack]:
    """Engine (scripted), gateway and a controller (default: local processes), one run at a time."""
    with (
        stack(tiny, tmp_path, script=script) as s,
        controller(s, tmp_path, None, runner, max_running=1, **controller_fields),
    ):
        yield s


def run_one(s: Stack, task: Task, settings: SpecSettings, timeout: float = 180) -> dict:
    (rid,) = create(s, [task], settings)
    return wait_status(s, rid, timeout=timeout)


def events(s: Stack, rid: str, kind: str) -> list[dict]:
    listed = s.admin.get(f"/api/rollouts/{rid}/events").json()
    return [e["data"] for e in listed if e["kind"] == kind]
