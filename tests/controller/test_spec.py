"""Bad specs are rejected, naming the field, before anything is created or launched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller import jobs, loop
from controller.spec import SpecError, load_spec, parse_spec
from tests.gateway.stack import ADMIN


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"harness": {"env": {}}}, "harness.command: Field required"),
        ({"harness": {"command": []}}, "harness.command"),
        ({"harness": {"command": ["x"], "resources": {"cpu": "lots"}}}, "harness.resources.cpu"),
        (
            {"harness": {"command": ["x"], "resources": {"memory": "1 GB"}}},
            "harness.resources.memory",
        ),
        (
            {"harness": {"command": ["x"], "colour": "red"}},
            "harness.colour: Extra inputs are not permitted",
        ),
        ({"harness": {"command": ["x"]}, "retries": 3}, "retries: Extra inputs"),
        ({"harness": {"command": ["x"], "timeout_s": 0}}, "harness.timeout_s"),
        ({"harness": {"command": ["x"], "env": {"1BAD": "v"}}}, "harness.env"),
        ({"harness": {"command": ["x"]}, "grader": {"image": "g"}}, "grader.command"),
    ],
)
def test_bad_spec_names_the_field(spec: dict, field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_spec(spec)


def test_yaml_and_json_load(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "harness:\n  command: [echo, hi]\n  resources: {cpu: 500m, memory: 64Mi}\n"
    )
    (tmp_path / "s.json").write_text(
        json.dumps({"harness": {"command": ["echo"]}, "max_attempts": 2})
    )
    assert load_spec(tmp_path / "s.yaml").harness.resources.cpu == "500m"
    assert load_spec(tmp_path / "s.json").max_attempts == 2
    (tmp_path / "bad.yaml").write_text("harness: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml"):
        load_spec(tmp_path / "bad.yaml")


def test_clis_reject_a_bad_spec_before_touching_the_gateway(
    gateway, tmp_path: Path, capsys
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("harness:\n  command: [x]\n  resources: {cpu: lots}\n")
    for main, argv in [
        (loop.main, ["--gateway", gateway.url, "--admin-key", ADMIN, "--spec", str(bad)]),
        (jobs.main, ["render", "--gateway", gateway.url, "--admin-key", ADMIN, "--spec", str(bad)]),
    ]:
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2
        assert "harness.resources.cpu" in capsys.readouterr().err
    assert gateway.admin.get("/api/rollouts").json() == []


def test_a_bad_spec_in_metadata_fails_that_rollout_as_a_task_failure(
    gateway, tmp_path: Path
) -> None:
    from tests.controller.conftest import controller, reasons, wait_status

    rid = gateway.rollout(metadata={"spec": {"harness": {"command": ["true"], "nice": 1}}})["id"]
    with controller(gateway, tmp_path, None):
        done = wait_status(gateway, rid)
    assert (done["status"], done["failure_kind"]) == ("failed", "task")
    assert any("metadata.spec: harness.nice" in r for r in reasons(gateway, rid))
