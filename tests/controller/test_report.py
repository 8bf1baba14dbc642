"""`controller/report.py` and `manifests.TIMED` as a rendered Job's pod runs them, without a
cluster: the wrapper under `sh` with GNU `timeout`, the reporter as `python3 -c` (the program
`manifests.reporter_program` ships) against a real gateway."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controller.manifests import TIMED, reporter_program
from tests.gateway.stack import Stack


def timed(ws: Path, name: str, seconds: float, *command: str, after: str = "") -> None:
    argv = ["sh", "-c", TIMED, "agl", str(ws / f".agl-{name}"), after, str(seconds), *command]
    assert subprocess.run(argv, timeout=30).returncode == 0  # always: the next container must run


def test_the_wrapper_keeps_exit_codes_times_out_and_skips_the_grader_after_a_failure(
    tmp_path: Path,
) -> None:
    timed(tmp_path, "harness", 30, "sh", "-c", "exit 3")
    assert (tmp_path / ".agl-harness").read_text().strip() == "3"
    timed(
        tmp_path,
        "grader",
        30,
        "touch",
        str(tmp_path / "graded"),
        after=str(tmp_path / ".agl-harness"),
    )
    assert not (tmp_path / "graded").exists() and not (tmp_path / ".agl-grader").exists()
    timed(tmp_path, "harness", 0.5, "sleep", "30")
    assert (tmp_path / ".agl-harness").read_text().strip() == "124"
    # It ignores TERM: killed 10 s later.
    timed(tmp_path, "harness", 0.5, "sh", "-c", "trap '' TERM; sleep 30")
    assert (tmp_path / ".agl-harness").read_text().strip() == "137"
    timed(tmp_path, "harness", 30, "true")
    timed(
        tmp_path,
        "grader",
        30,
        "touch",
        str(tmp_path / "graded"),
        after=str(tmp_path / ".agl-harness"),
    )
    assert (tmp_path / "graded").exists() and (tmp_path / ".agl-grader").read_text().strip() == "0"


def run_report(gateway: Stack, made: dict, ws: Path, codes: dict[str, int], token: str) -> int:
    for name, code in codes.items():
        (ws / f".agl-{name}").write_text(f"{code}\n")
    env = {"PATH": os.environ["PATH"], "AGL_GATEWAY_URL": gateway.url, "AGL_ROLLOUT_ID": made["id"]}
    env |= {"AGL_ATTEMPT": "1", "AGL_TOKEN": made[token]}
    graded = "graded" if token == "grader_token" else "ungraded"
    argv = ["python3", "-c", reporter_program(), str(ws), graded]
    # From the workspace: no `controller` package to import there, as in the pod.
    return subprocess.run(argv, env=env, cwd=ws, timeout=60).returncode


@pytest.mark.parametrize(
    ("codes", "grader", "reward", "want"),
    [
        ({"harness": 0}, False, 1.0, ("succeeded", None)),
        ({"harness": 0}, False, None, ("failed", "task")),  # no final reward
        ({"harness": 3}, False, 1.0, ("failed", "task")),
        ({"harness": 124}, False, None, ("timed_out", "task")),
        ({"harness": 137}, False, None, ("timed_out", "task")),  # it ignored SIGTERM
        ({"harness": 127}, False, None, ("failed", "infra")),  # not in the image
        ({}, False, None, ("failed", "infra")),  # the wrapper never wrote
        ({"harness": 0, "grader": 0}, True, 0.5, ("succeeded", None)),
        ({"harness": 0, "grader": 1}, True, None, ("failed", "infra")),
        ({"harness": 0}, True, None, ("failed", "infra")),  # the grader never ran
    ],
)
def test_the_reporter_posts_the_end_the_controller_would(
    gateway: Stack, tmp_path: Path, codes, grader, reward, want
):
    made = gateway.rollout(grader=grader or None)
    token = "grader_token" if grader else "agent_token"
    if reward is not None:
        auth = {"Authorization": f"Bearer {made[token]}"}
        gateway.admin.post(
            f"/api/rollouts/{made['id']}/reward", json={"reward": reward}, headers=auth
        )
    assert run_report(gateway, made, tmp_path, codes, token) == 0
    done = gateway.admin.get(f"/api/rollouts/{made['id']}").json()
    assert (done["status"], done["failure_kind"]) == want
    assert done["reward"] == reward


def test_the_reporter_leaves_a_cancelled_rollout_alone(gateway: Stack, tmp_path: Path) -> None:
    made = gateway.rollout()
    gateway.admin.post(
        f"/api/rollouts/{made['id']}/status", json={"status": "cancelled"}
    ).raise_for_status()
    assert run_report(gateway, made, tmp_path, {"harness": 0}, "agent_token") == 0
    assert gateway.admin.get(f"/api/rollouts/{made['id']}").json()["status"] == "cancelled"
