"""The rollout spec of one SWE task, and the rollouts that carry it.

`task_spec(task, settings)` is the controller's spec (`controller/spec.py`) for one task, as a
plain dict: the harness (`harness.py`: mini-SWE-agent in the task's repository, history cut) and
the grader (`grade.py`: with the grader token), both in the task's image. On Kubernetes the Job
is the controller's (harness as init container, grader as main container, an emptyDir workspace
between them that carries only the patch and the trajectory); its pods carry the label
`agl.dev/recipe: swe` that `k8s/network-policy.yaml` selects. `create_rollouts` creates rollouts
whose metadata carries that spec, so a controller started without `--spec` runs them.

In pods the image must hold a Python with mini-swe-agent and this folder (see `Dockerfile`);
`SpecSettings` says where. For local processes (and kube-local, whose pods are host processes)
the same fields point at this checkout, the venv and a local clone of the task's repository.
It does not launch anything or talk to Kubernetes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from examples.swe.tasks import Task, load

HERE = Path(__file__).resolve().parent
RECIPE_LABEL = {"agl.dev/recipe": "swe"}


@dataclass(frozen=True)
class SpecSettings:
    python: str = "/opt/agl-swe/venv/bin/python"  # has mini-swe-agent 2.4.6 (harness)
    grader_python: str = "python"  # the task environment's Python (runs the tests)
    recipe_dir: str = "/opt/agl-swe/recipe"  # harness.py, grade.py, agent.yaml
    source: str = "/testbed"  # the task repository with its git history (the image's copy)
    repo: str = "/testbed"  # where the agent works; == source: in place, history removed first
    grade_repo: str = "/testbed"  # where the grader applies the patch (its own container's copy)
    image: str = "{image_name}"  # formatted with the task's fields
    model: str = "openai/policy"  # litellm name; the gateway serves any name
    step_limit: int = 100
    harness_timeout_s: float = 3600.0
    grader_timeout_s: float = 900.0
    test_timeout_s: float = 600.0
    # grade.py flags: turn_penalty, free_turns, ...
    shaping: dict[str, float] = field(default_factory=dict)
    namespace: str = "default"
    workspace: str = "/workspace"
    cpu: str | None = "2"
    memory: str | None = "4Gi"
    max_attempts: int = 3


def load_settings(path: str | Path) -> SpecSettings:
    """SpecSettings from a YAML mapping of its fields (e.g. `examples/swe/settings.yaml`)."""
    return SpecSettings(**(yaml.safe_load(Path(path).read_text()) or {}))


def task_spec(task: Task, s: SpecSettings) -> dict[str, Any]:
    image = s.image.format(**task.record())
    resources = {k: v for k, v in {"cpu": s.cpu, "memory": s.memory}.items() if v}
    harness = [s.python, f"{s.recipe_dir}/harness.py", "--source", s.source, "--repo", s.repo]
    harness += ["--model", s.model, "--step-limit", str(s.step_limit)]
    harness += ["--config", f"{s.recipe_dir}/agent.yaml"]
    grader = [s.grader_python, f"{s.recipe_dir}/grade.py", "--source", s.source]
    grader += ["--repo", s.grade_repo, "--test-timeout", str(s.test_timeout_s)]
    for name, value in s.shaping.items():
        grader += [f"--{name.replace('_', '-')}", str(value)]
    return {
        "harness": {
            "command": harness,
            "timeout_s": s.harness_timeout_s,
            "image": image,
            "resources": resources,
        },
        "grader": {
            "command": grader,
            "timeout_s": s.grader_timeout_s,
            "image": image,
            "resources": resources,
        },
        "max_attempts": s.max_attempts,
        "namespace": s.namespace,
        "workspace": s.workspace,
        "labels": dict(RECIPE_LABEL),
    }


def entry(task: Task, s: SpecSettings) -> dict[str, Any]:
    """One line of `agl train`'s task file: what the harness sees, the spec it runs, and a grader."""
    return {"task": task.rollout_task(), "spec": task_spec(task, s), "grader": True}


async def create_rollouts(
    gw: Any, tasks: list[Task], s: SpecSettings, *, k: int, prefix: str, mode: str
) -> list[str]:
    """k rollouts per task (group `<prefix><instance_id>`), each carrying its spec; their IDs.
    `gw` is an `agl.client.GatewayClient`."""
    ids = []
    for task in tasks:
        e = entry(task, s)
        group = prefix + task.instance_id
        for _ in range(k):
            created = await gw.create_rollout(
                e["task"], group, mode=mode, grader=True, metadata={"spec": e["spec"]}
            )
            ids.append(created["id"])
    return ids


def main(argv: list[str] | None = None) -> int:
    """`python -m examples.swe.spec --tasks clean/train.jsonl --settings settings.yaml
    --out train.entries.jsonl`"""
    parser = argparse.ArgumentParser(
        description="Write agl train's task file: one entry (task, spec, grader) per task."
    )
    parser.add_argument(
        "--tasks", required=True, help="cleaned task records (JSONL) or a Hugging Face dataset"
    )
    parser.add_argument("--split", default="train")
    parser.add_argument("--settings", default=str(HERE / "settings.yaml"))
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    settings = load_settings(args.settings)
    tasks = load(args.tasks, args.split)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(entry(t, settings)) + "\n" for t in tasks))
    print(f"{len(tasks)} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
