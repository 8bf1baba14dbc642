"""The SWE recipe end to end with local processes: the real controller runs `harness.py` (the real
mini-SWE-agent 2.4.6 in the toy repository, against the real gateway) and then `grade.py` with the
grader token; the engine is scripted (the tiny model cannot fix code), so each case's replies are
given. Everything else is real: git, pytest in the graded checkout, HTTP, SQLite."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from adapters import AdapterSettings, build_batch
from agl.client import GatewayClient
from examples.swe.evaluate import collect
from examples.swe.tasks import Task
from tests.controller.conftest import reasons
from tests.examples.swe.conftest import events, local_settings, recipe_stack, run_one
from tests.gateway.stack import ADMIN
from tests.gateway.test_mini_swe_agent import SUBMIT, tool_call

pytestmark = pytest.mark.slow
FIX = tool_call("sed -i '2s/a - b/a + b/' calc/core.py")
WRONG = tool_call("sed -i '2s/a - b/a * b/' calc/core.py")


async def preds_of(url: str, task: Task) -> tuple[dict, float]:
    async with GatewayClient(url, ADMIN) as gw:
        return await collect(gw, [task], "toy", prefix="swe-")


def workspace(tmp_path: Path, rid: str) -> Path:
    return tmp_path / "state" / "logs" / rid / "1" / "workspace"


def test_correct_fix_earns_1_wrong_fix_0_and_the_adapter_merges_calls(
    tiny_path: Path, tmp_path: Path, toy
) -> None:
    source, task = toy
    settings = local_settings(source)
    with recipe_stack(tiny_path, tmp_path, [FIX, tool_call(SUBMIT), WRONG, tool_call(SUBMIT)]) as s:
        good = run_one(s, task, settings)
        bad = run_one(s, task, settings)
        assert (good["status"], good["reward"]) == ("succeeded", 1.0), reasons(s, good["id"])
        assert (bad["status"], bad["reward"]) == ("succeeded", 0.0), reasons(s, bad["id"])
        (grade,) = events(s, good["id"], "swe_grade")
        assert grade["results"] == {
            "tests/test_calc.py::test_add": "PASSED",
            "tests/test_calc.py::test_sub": "PASSED",
        }
        (bad_grade,) = events(s, bad["id"], "swe_grade")
        assert bad_grade["results"]["tests/test_calc.py::test_add"] == "FAILED"
        assert events(s, good["id"], "flag") == []
        (patch,) = events(s, good["id"], "swe_patch")
        assert "+    return a + b" in patch["model_patch"]
        assert patch["instance_id"] == task.instance_id
        preds, pass_at_1 = asyncio.run(preds_of(s.url, task))
        named = {"instance_id": task.instance_id, "model_name_or_path": "toy"}
        assert preds == {task.instance_id: named | patch}
        assert pass_at_1 == 0.5
        rollouts = [s.store.get_rollout(r["id"]) for r in (good, bad)]
        calls = s.store.calls_for([r.id for r in rollouts])
    traj = json.loads((workspace(tmp_path, good["id"]) / "traj.json").read_text())
    assert traj["info"]["exit_status"] == "Submitted"

    batch = build_batch(rollouts, calls, AdapterSettings())
    # one token sequence per rollout
    assert batch.metrics["rollouts_trained"] == 2 and batch.n_samples == 2
    # of each rollout's two calls, the second extended the first
    assert batch.metrics["merge_rate"] == 0.5
    advantage = dict(zip(batch.rollout_ids, batch.rollout_advantages, strict=True))
    assert advantage[good["id"]] > 0 and advantage[good["id"]] == -advantage[bad["id"]]


def test_a_test_edit_is_reverted_flagged_and_earns_0(tiny_path: Path, tmp_path: Path, toy) -> None:
    """The edit would make the tests pass on the buggy code; reverted, they fail."""
    source, task = toy
    edit = "sed -i 's/== 5/!= 5/' tests/test_calc.py && echo 'collect_ignore = []' > conftest.py"
    hack = tool_call(edit)
    with recipe_stack(tiny_path, tmp_path, [hack, tool_call(SUBMIT)]) as s:
        done = run_one(s, task, local_settings(source))
        assert (done["status"], done["reward"]) == ("succeeded", 0.0), reasons(s, done["id"])
        flags = events(s, done["id"], "flag")
        assert sorted((f["flag"], f["path"], f["change"]) for f in flags) == [
            ("test_edit", "conftest.py", "A"),
            ("test_edit", "tests/test_calc.py", "M"),
        ]
        # what the agent did is kept
        assert "!= 5" in events(s, done["id"], "swe_patch")[0]["model_patch"]
        assert events(s, done["id"], "swe_grade")[0]["flags"] == {"test_edit": 2}
    graded = workspace(tmp_path, done["id"]) / "grade"
    assert "== 5" in (graded / "tests" / "test_calc.py").read_text()
    assert not (graded / "conftest.py").exists()


def test_reading_git_history_is_flagged_and_finds_no_history(
    tiny_path: Path, tmp_path: Path, toy
) -> None:
    source, task = toy
    peek = tool_call("git log --oneline --all && git rev-list --all | wc -l")
    with recipe_stack(tiny_path, tmp_path, [peek, FIX, tool_call(SUBMIT)]) as s:
        done = run_one(s, task, local_settings(source))
        # flags cost nothing
        assert (done["status"], done["reward"]) == ("succeeded", 1.0), reasons(s, done["id"])
        flags = events(s, done["id"], "flag")
        found = [(f["flag"], f["call_seq"], f["match"]) for f in flags]
        assert found == [("git_history", 0, "git log")], flags
    repo = workspace(tmp_path, done["id"]) / "repo"
    history = subprocess.run(
        ["git", "rev-list", "--all"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert len(history.stdout.split()) == 1  # one commit, made by the harness
    for commit in ("main", task.base_commit):  # neither the original nor the bug commit is there
        rev_parse = ["git", "rev-parse", commit]
        sha = subprocess.run(rev_parse, cwd=source, capture_output=True, text=True).stdout.strip()
        found = subprocess.run(["git", "cat-file", "-e", sha], cwd=repo, capture_output=True)
        assert found.returncode != 0
    traj = json.loads((workspace(tmp_path, done["id"]) / "traj.json").read_text())
    observation = json.dumps(traj["messages"][3])  # the tool output of the first command
    assert " task\\n1\\n" in observation, observation
