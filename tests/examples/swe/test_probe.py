"""The difficulty probe through the real stack (scripted engine, controller with local processes,
real mini-SWE-agent and grader): two tasks, k=2; then the cleaning pipeline reads its result."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from agl.client import GatewayClient
from examples.swe import tasks
from examples.swe.probe import probe
from tests.examples.swe.conftest import local_settings, recipe_stack
from tests.examples.swe.test_e2e_local import FIX, WRONG
from tests.gateway.stack import ADMIN
from tests.gateway.test_mini_swe_agent import SUBMIT, tool_call

pytestmark = pytest.mark.slow


def test_probe_two_tasks_k2_then_clean(tiny_path: Path, tmp_path: Path, toy) -> None:
    source, task = toy
    statement = task.problem_statement + " (reported twice)"
    twin_id = task.instance_id + "_twin"
    twin = dataclasses.replace(task, instance_id=twin_id, problem_statement=statement)
    # one rollout of four solves it
    script = [FIX, tool_call(SUBMIT)] + [WRONG, tool_call(SUBMIT)] * 3

    async def run(url: str) -> dict[str, list[float]]:
        async with GatewayClient(url, ADMIN) as gw:
            return await probe(gw, [task, twin], local_settings(source), k=2, poll_s=0.2)

    with recipe_stack(tiny_path, tmp_path, script) as s:
        rewards = asyncio.run(run(s.url))
    assert sorted(rewards) == sorted([task.instance_id, twin.instance_id])
    assert sorted(sorted(r) for r in rewards.values()) == [[0.0, 0.0], [0.0, 1.0]]
    mixed = next(i for i, r in rewards.items() if 1.0 in r)
    train, validation, report = tasks.clean(
        [task, twin], probe=rewards, never_solved_share=0.0, validation_share=0
    )
    assert [t.instance_id for t in train] == [mixed] and validation == []
    assert report.steps[-1]["examples"][0]["why"] == "never solved (0/2), beyond the kept share"
