"""`agl jobs list` and `agl jobs cancel` against a real gateway (render and apply:
tests/controller/test_kube.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from controller import jobs
from tests.gateway.stack import ADMIN


def test_list_and_cancel_a_group_of_rendered_rollouts(
    gateway, tmp_path: Path, capsys, monkeypatch
) -> None:
    (tmp_path / "spec.yaml").write_text("harness: {command: [python, harness.py]}\n")
    common = ["--group", "batch-1", "--gateway", gateway.url, "--admin-key", ADMIN]
    rendered = ["render", "--spec", str(tmp_path / "spec.yaml"), "--count", "3", *common]
    assert jobs.main(rendered) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Secret", "Job"] * 3
    # the tokens expire an hour (--apply-within-s) after the Job's deadline from now: the
    # harness's default 3600 s and the report's 120 s
    expiry = int(docs[0]["stringData"]["agent-token"].split(".")[0])
    assert abs(expiry - (time.time() + 3600 + 120 + 3600)) < 60
    other = gateway.rollout(group="batch-2")["id"]
    ids = [r["id"] for r in gateway.admin.get("/api/rollouts", params={"group": "batch-1"}).json()]
    # One runs, one has ended.
    for rid, status in [(ids[0], "running"), (ids[1], "running"), (ids[1], "failed")]:
        body = {"status": status, "failure_kind": "task" if status == "failed" else None}
        gateway.admin.post(f"/api/rollouts/{rid}/status", json=body).raise_for_status()

    def listed(command: str) -> dict[str, str]:
        assert jobs.main([command, *common]) == 0
        return {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}

    assert listed("list") == {ids[0]: "running", ids[1]: "failed", ids[2]: "queued"}
    assert listed("cancel") == {ids[0]: "cancelled", ids[1]: "failed", ids[2]: "cancelled"}
    assert listed("list") == {ids[0]: "cancelled", ids[1]: "failed", ids[2]: "cancelled"}
    # Another group's.
    assert gateway.admin.get(f"/api/rollouts/{other}").json()["status"] == "queued"
    monkeypatch.delenv("AGL_CONTROLLER_ADMIN_KEY", raising=False)
    with pytest.raises(SystemExit) as refused:
        jobs.main(["cancel", "--group", "batch-2", "--gateway", gateway.url])
    assert refused.value.code == 2 and "admin key" in capsys.readouterr().err
    assert gateway.admin.get(f"/api/rollouts/{other}").json()["status"] == "queued"
