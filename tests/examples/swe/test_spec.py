"""The recipe's per-task spec is a valid controller spec, and its Job and NetworkPolicy validate
against the Kubernetes schema (offline, with kubernetes-validate)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import yaml

from controller.launcher import Credentials
from controller.manifests import manifests
from controller.spec import parse_spec
from examples.swe.spec import RECIPE_LABEL, load_settings, task_spec
from examples.swe.tasks import Task
from tests.examples.swe.conftest import HERE, RECIPE

VALIDATE = Path(__file__).parents[3] / ".venv" / "bin" / "kubernetes-validate"


def test_the_spec_runs_the_task_image_with_harness_then_grader(tmp_path: Path) -> None:
    task = Task.from_record(json.loads((HERE / "toy" / "task.json").read_text()))
    shaping = {"turn_penalty": 0.01, "free_turns": 20}
    settings = dataclasses.replace(load_settings(RECIPE / "settings.yaml"), shaping=shaping)
    spec = parse_spec(task_spec(task, settings))
    image = "registry.example.com/agl-swe/" + task.image_name
    grader = spec.grader
    assert grader is not None
    assert spec.harness.image == grader.image == image
    assert spec.harness.command[:2] == [
        "/opt/agl-swe/venv/bin/python",
        "/opt/agl-swe/recipe/harness.py",
    ]
    assert grader.command[0] == "/opt/miniconda3/envs/testbed/bin/python"
    assert grader.command[-4:] == ["--turn-penalty", "0.01", "--free-turns", "20"]
    assert spec.labels == RECIPE_LABEL
    creds = Credentials(
        "r" * 32, 1, task.rollout_task(), "http://gw:8000", "http://gw:8000/v1", "t", "g"
    )
    secret, job = manifests(spec, creds)
    assert job["spec"]["template"]["metadata"]["labels"]["agl.dev/recipe"] == "swe"
    containers = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in containers[0]["env"]}
    assert "patch" not in json.loads(env["AGL_TASK"])
    rendered = tmp_path / "job.yaml"
    rendered.write_text(yaml.safe_dump_all([secret, job]))
    if VALIDATE.exists():
        for path in (rendered, RECIPE / "k8s" / "network-policy.yaml"):
            done = subprocess.run(
                [str(VALIDATE), "--strict", str(path)], capture_output=True, text=True
            )
            assert done.returncode == 0, done.stdout + done.stderr


def test_train_entries_feed_agl_train_with_the_recipes_config(tmp_path: Path) -> None:
    """`python -m examples.swe.spec` writes the task file examples/swe/train.yaml names; both load."""
    from examples.swe.spec import main
    from trainer.config import load_config
    from trainer.loop import read_tasks

    out = tmp_path / "train.entries.jsonl"
    assert main(["--tasks", str(RECIPE / "data" / "sample.jsonl"), "--out", str(out)]) == 0
    entries = read_tasks(str(out), None)  # no agl.spec: every entry carries its own
    for e in entries:
        assert e["grader"] is True and "patch" not in e["task"]
        parse_spec(e["spec"])
    cfg, agl = load_config(RECIPE / "train.yaml", ["agl.admin_key=k", f"agl.tasks={out}"])
    assert agl.spec is None and agl.loss_mode == "rollout" and agl.mode == "async"
    assert cfg.trainer.device == "cuda" and cfg.trainer.n_gpus_per_node == 8
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3.5-9B"
