"""Manifest construction and Job/Pod outcome mapping, without a cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agl.types import FailureKind, Status
from controller.launcher import Credentials
from controller.manifests import job_outcome, key_of, manifests
from controller.spec import parse_spec

CREDS = Credentials(
    rollout_id="r" * 32,
    attempt=2,
    task={"q": 1},
    gateway_url="http://gw",
    base_url="http://gw/v1",
    agent_token="AGENT-SECRET",
    grader_token="GRADER-SECRET",
)


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_job_without_grader() -> None:
    spec = parse_spec(
        {"harness": {"command": ["run"], "timeout_s": 90.5, "resources": {"cpu": "1"}}}
    )
    secret, job = manifests(spec, CREDS)
    assert key_of(job) == key_of(secret) == key_of(job["spec"]["template"]) == ("r" * 32, 2)
    assert secret["stringData"] == {"agent-token": "AGENT-SECRET", "grader-token": "GRADER-SECRET"}
    assert "SECRET" not in json.dumps(job)  # tokens only in the Secret
    js = job["spec"]
    assert (js["backoffLimit"], js["activeDeadlineSeconds"], js["ttlSecondsAfterFinished"]) == (
        0,
        91,
        3600,
    )
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and "initContainers" not in pod
    (harness,) = pod["containers"]
    env = _env(harness)
    assert env["OPENAI_API_KEY"] == {
        "secretKeyRef": {"name": job["metadata"]["name"], "key": "agent-token"}
    }
    assert env["OPENAI_BASE_URL"] == "http://gw/v1" and json.loads(env["AGL_TASK"]) == {"q": 1}
    assert "AGL_GRADER_TOKEN" not in env
    assert harness["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}


def test_job_with_grader_separates_tokens() -> None:
    spec = parse_spec(
        {"harness": {"command": ["run"]}, "grader": {"command": ["grade"], "image": "g:1"}}
    )
    _, job = manifests(spec, CREDS)
    pod = job["spec"]["template"]["spec"]
    (harness,) = pod["initContainers"]
    (grader,) = pod["containers"]
    assert harness["name"] == "harness" and grader["name"] == "grader" and grader["image"] == "g:1"
    assert _env(grader)["AGL_GRADER_TOKEN"]["secretKeyRef"]["key"] == "grader-token"
    assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} & set(_env(grader))
    assert "AGL_GRADER_TOKEN" not in _env(harness)
    assert (
        harness["volumeMounts"]
        == grader["volumeMounts"]
        == [{"name": "workspace", "mountPath": "/workspace"}]
    )
    assert pod["volumes"] == [{"name": "workspace", "emptyDir": {}}]


def _pod(containers: list[dict], init: list[dict] | None = None, **status: object) -> dict:
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"containerStatuses": containers, "initContainerStatuses": init or [], **status},
    }


def _ended(name: str, code: int, reason: str = "Error") -> dict:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason}}}


def _job(kind: str | None, reason: str = "") -> dict:
    return {
        "status": {
            "conditions": [{"type": kind, "status": "True", "reason": reason}] if kind else []
        }
    }


@pytest.mark.parametrize(
    ("job", "pods", "want"),
    [
        (_job("Complete"), [], (Status.SUCCEEDED, None)),
        (_job("Failed", "DeadlineExceeded"), [], (Status.TIMED_OUT, FailureKind.TASK)),
        (
            _job("Failed", "BackoffLimitExceeded"),
            [_pod([_ended("harness", 2)])],
            (Status.FAILED, FailureKind.TASK),
        ),
        (
            _job("Failed", "BackoffLimitExceeded"),
            [_pod([_ended("grader", 1)], [_ended("harness", 0, "Completed")])],
            (Status.FAILED, FailureKind.INFRA),
        ),
        (
            _job("Failed", "BackoffLimitExceeded"),
            [_pod([], reason="Evicted")],
            (Status.FAILED, FailureKind.INFRA),
        ),
        (
            _job("Failed", "BackoffLimitExceeded"),
            [_pod([], reason="NodeLost")],
            (Status.FAILED, FailureKind.INFRA),
        ),
        (
            _job("Failed", "BackoffLimitExceeded"),
            [_pod([_ended("harness", 128, "StartError")])],
            (Status.FAILED, FailureKind.INFRA),
        ),
        (_job("Failed", "BackoffLimitExceeded"), [], (Status.FAILED, FailureKind.INFRA)),
        (
            _job(None),
            [_pod([{"name": "harness", "state": {"waiting": {"reason": "ImagePullBackOff"}}}])],
            (Status.FAILED, FailureKind.INFRA),
        ),
        (_job(None), [_pod([{"name": "harness", "state": {"running": {}}}])], None),
        # The Job controller has not caught up yet.
        (_job(None), [_pod([_ended("harness", 1)])], None),
    ],
)
def test_outcomes(job: dict, pods: list[dict], want: tuple | None) -> None:
    outcome = job_outcome(job, pods)
    assert (None if outcome is None else (outcome.status, outcome.failure_kind)) == want


def test_rendered_manifests_pass_strict_validation(tmp_path: Path) -> None:
    tool = shutil.which("kubernetes-validate") or str(
        Path(__file__).parents[2] / ".venv/bin/kubernetes-validate"
    )
    if not Path(tool).exists():
        pytest.skip("kubernetes-validate is not installed")
    spec = parse_spec(
        {
            "harness": {
                "command": ["run"],
                "resources": {"cpu": "500m", "memory": "64Mi"},
                "env": {"A": "b"},
            },
            "grader": {"command": ["grade"]},
            "labels": {"team": "rl"},
            "node_selector": {"pool": "cpu"},
            "service_account": "runner",
        }
    )
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all(manifests(spec, CREDS)))
    for version in ("1.25.0", "1.37.0"):  # its oldest schema; 1.20 is checked by kubectl apply
        done = subprocess.run(
            [tool, "--strict", "-k", version, str(path)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_rendered_job_reports_its_own_end_with_the_graders_token() -> None:
    spec = parse_spec(
        {"harness": {"command": ["run", "x"], "timeout_s": 60}, "grader": {"command": ["grade"]}}
    )
    _, job = manifests(spec, CREDS, reported=True)
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["harness", "grader"]
    (last,) = pod["containers"]
    assert (
        last["name"] == "report"
        and last["image"] == "python:3.11-slim"
        and last["command"][:2] == ["python3", "-c"]
    )
    assert _env(last)["AGL_TOKEN"] == {
        "secretKeyRef": {"name": job["metadata"]["name"], "key": "grader-token"}
    }
    assert "OPENAI_API_KEY" not in _env(last) and "AGL_GRADER_TOKEN" not in _env(last)
    harness = pod["initContainers"][0]["command"]
    assert harness[:2] == ["sh", "-c"] and harness[-5:] == [
        "/workspace/.agl-harness",
        "",
        "60.0",
        "run",
        "x",
    ]
    # The grader's default timeout, the report's.
    assert job["spec"]["activeDeadlineSeconds"] == 60 + 3600 + 120
    ungraded = parse_spec({"harness": {"command": ["run"]}})
    (last,) = manifests(ungraded, CREDS, reported=True)[1]["spec"]["template"]["spec"]["containers"]
    assert _env(last)["AGL_TOKEN"]["secretKeyRef"]["key"] == "agent-token"
