"""The pod path of harness and grader, without the agent: in a pod each container has its own copy
of the task repository (`/testbed`, the task branch fetched as `origin/<branch>` at image build),
and both work in place. Two clones of the toy repository stand for the two containers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from examples.swe import grade, harness


def clone(source: Path, where: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(source), str(where)], check=True)
    return where


def test_in_place_harness_cuts_history_and_grader_grades_its_own_copy(tmp_path: Path, toy) -> None:
    source, task = toy
    agent_side = clone(source, tmp_path / "harness-testbed")
    grader_side = clone(source, tmp_path / "grader-testbed")
    harness.prepare(agent_side, agent_side, task.base_commit)  # only origin/<branch> exists there
    commits = subprocess.run(
        ["git", "rev-list", "--all"], cwd=agent_side, capture_output=True, text=True, check=True
    )
    assert len(commits.stdout.split()) == 1
    assert not (agent_side / ".git" / "refs" / "remotes").exists()
    core = agent_side / "calc" / "core.py"
    assert "return a - b" in core.read_text().split("def sub")[0]  # the task's bug is there
    core.write_text(core.read_text().replace("a - b", "a + b", 1))
    # reverted by the grader
    (agent_side / "conftest.py").write_text("collect_ignore = ['tests']\n")
    patch = harness.diff(agent_side)

    base = grade.resolve(grader_side, task.base_commit)
    grade.checkout(grader_side, grader_side, base)
    assert grade.apply(grader_side, patch)
    flags, removed = grade.safeguard(grader_side, base, base, {"tests/test_calc.py"})
    assert [(f["flag"], f["path"]) for f in flags] == [("test_edit", "conftest.py")]
    assert removed == []
    tests = task.FAIL_TO_PASS + task.PASS_TO_PASS
    assert grade.run_tests(grader_side, tests, "", 60) == dict.fromkeys(tests, "PASSED")
    assert grade.run_tests(grader_side, tests, f"{sys.executable} -m pytest -rA -k sub", 60) == {
        "tests/test_calc.py::test_add": "MISSING",  # deselected: not reported PASSED
        "tests/test_calc.py::test_sub": "PASSED",
    }
