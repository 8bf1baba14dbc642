"""One table of how an attempt ends, and every path that decides it held to it: the rule itself
(`controller/outcome.py`), local processes through the real controller and gateway, a Job's
status as Kubernetes reports it, and a rendered Job's reporter as its pod runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agl.types import FailureKind, Status
from controller.manifests import job_outcome, reporter_program
from controller.outcome import exited, rewarded
from tests.controller.conftest import controller, reasons, script, wait_status
from tests.gateway.stack import Stack


@dataclass(frozen=True)
class Case:
    """An attempt's end: the harness's exit code (None: it left none), the grader's if `graded`
    (None: it left none), the final reward (None: none was posted), and the status it must get."""

    harness: int | None
    status: Status
    kind: FailureKind | None
    graded: bool = False
    grader: int | None = 0
    reward: float | None = 1.0


TASK = FailureKind.TASK
INFRA = FailureKind.INFRA
CASES = [
    Case(harness=0, status=Status.SUCCEEDED, kind=None),
    Case(harness=0, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=1, status=Status.FAILED, kind=TASK),
    Case(harness=2, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=124, status=Status.TIMED_OUT, kind=TASK),
    Case(harness=137, reward=None, status=Status.TIMED_OUT, kind=TASK),
    Case(harness=126, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=127, status=Status.FAILED, kind=INFRA),
    Case(harness=None, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=0, graded=True, grader=0, reward=0.5, status=Status.SUCCEEDED, kind=None),
    Case(harness=0, graded=True, grader=0, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=0, graded=True, grader=1, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=0, graded=True, grader=2, reward=0.5, status=Status.FAILED, kind=INFRA),
    Case(harness=0, graded=True, grader=None, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=2, graded=True, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=127, graded=True, reward=None, status=Status.FAILED, kind=INFRA),
]


@pytest.mark.parametrize("case", CASES)
def test_the_rule(case: Case) -> None:
    outcome = rewarded(exited(case.harness, case.grader, graded=case.graded), case.reward)
    assert (outcome.status, outcome.failure_kind) == (case.status, case.kind), outcome.reason


# A harness or grader: posts the reward it is given (REWARD) with its token, then exits EXIT, or
# with EXIT=none kills its whole process group, so that no exit code is written.
PROGRAM = """
import json, os, signal, sys, urllib.request
if os.environ.get("REWARD"):
    token = os.environ.get("AGL_GRADER_TOKEN") or os.environ["OPENAI_API_KEY"]
    url = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"] + "/reward"
    body = json.dumps({"reward": float(os.environ["REWARD"])}).encode()
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30)
if os.environ["EXIT"] == "none":
    os.killpg(0, signal.SIGKILL)
sys.exit(int(os.environ["EXIT"]))
"""


def _env(code: int | None, reward: float | None) -> dict[str, str]:
    env = {"EXIT": str(code)}
    if code is None:
        env["EXIT"] = "none"
    if reward is not None:
        env["REWARD"] = str(reward)
    return env


def _local_spec(command: list[str], case: Case) -> dict:
    """The case as a spec: the harness posts the reward, or the grader if there is one."""
    harness_reward = case.reward
    if case.graded:
        harness_reward = None
    spec: dict = {
        "harness": {"command": command, "env": _env(case.harness, harness_reward)},
        "max_attempts": 1,  # an infra failure ends the rollout, not retried
    }
    if case.graded:
        spec["grader"] = {"command": command, "env": _env(case.grader, case.reward)}
    return spec


def test_the_local_launcher_and_the_loop(gateway: Stack, tmp_path: Path) -> None:
    command = script(tmp_path, "program.py", PROGRAM)
    made = []
    for case in CASES:
        spec = _local_spec(command, case)
        made.append(gateway.rollout(grader=case.graded or None, metadata={"spec": spec})["id"])
    with controller(gateway, tmp_path, None, max_running=len(CASES)):
        done = [wait_status(gateway, rid) for rid in made]
    for case, rid, rollout in zip(CASES, made, done, strict=True):
        got = (rollout["status"], rollout["failure_kind"])
        assert got == (case.status, case.kind), (case, reasons(gateway, rid))


def _terminated(name: str, code: int) -> dict:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": "Error"}}}


def _job_and_pods(case: Case) -> tuple[dict, list[dict]]:
    """What Kubernetes reports of a plain Job (harness, then grader) that ended as `case` says:
    Complete, or Failed with a container's exit code, or with no pod left (no exit code)."""
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    if case.harness == 0 and (not case.graded or case.grader == 0):
        condition = {"type": "Complete", "status": "True"}
    job = {"status": {"conditions": [condition]}}
    if case.harness is None:
        return job, []
    statuses = {"containerStatuses": [_terminated("harness", case.harness)]}
    if case.graded:
        grader = []
        if case.harness == 0 and case.grader is not None:
            grader = [_terminated("grader", case.grader)]
        statuses = {
            "initContainerStatuses": [_terminated("harness", case.harness)],
            "containerStatuses": grader,
        }
    pod = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}, "status": statuses}
    return job, [pod]


@pytest.mark.parametrize("case", CASES)
def test_a_job_s_status_and_the_loop(case: Case) -> None:
    job, pods = _job_and_pods(case)
    found = job_outcome(job, pods)
    assert found is not None
    outcome = rewarded(found, case.reward)
    assert (outcome.status, outcome.failure_kind) == (case.status, case.kind), outcome.reason


def test_the_reporter_of_a_rendered_job(gateway: Stack, tmp_path: Path) -> None:
    """The reporter as its pod runs it: `python3 -c` with the shipped program, from a folder
    where no `controller` package can be imported."""
    for i, case in enumerate(CASES):
        made = gateway.rollout(grader=case.graded or None)
        token = made["grader_token"] if case.graded else made["agent_token"]
        if case.reward is not None:
            auth = {"Authorization": f"Bearer {token}"}
            reward = {"reward": case.reward}
            posted = gateway.admin.post(
                f"/api/rollouts/{made['id']}/reward", json=reward, headers=auth
            )
            posted.raise_for_status()
        ws = tmp_path / str(i)
        ws.mkdir()
        if case.harness is not None:
            (ws / ".agl-harness").write_text(f"{case.harness}\n")
        if case.graded and case.harness == 0 and case.grader is not None:
            (ws / ".agl-grader").write_text(f"{case.grader}\n")
        env = {
            "PATH": os.environ["PATH"],
            "AGL_GATEWAY_URL": gateway.url,
            "AGL_ROLLOUT_ID": made["id"],
            "AGL_ATTEMPT": "1",
            "AGL_TOKEN": token,
        }
        graded = "graded" if case.graded else "ungraded"
        # -I -S: no site-packages, no working directory on the path: the standard library only.
        argv = [sys.executable, "-I", "-S", "-c", reporter_program(), str(ws), graded]
        assert subprocess.run(argv, env=env, cwd=ws, timeout=60).returncode == 0
        done = gateway.admin.get(f"/api/rollouts/{made['id']}").json()
        assert (done["status"], done["failure_kind"]) == (case.status, case.kind), case
