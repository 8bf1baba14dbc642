"""An example's `train.yaml` run for a few steps, as a user runs it, on a real stack on 127.0.0.1.

The embedded engine serves the tiny random model in scripted mode: a random model cannot carry out a task,
so the script gives the completions (in order, whichever rollout asks), and the log-probs recorded are the
model's own, teacher-forced, so training is real. The gateway (SQLite), a controller running the example's
unchanged harness as local processes, and verl's workers on the CPU (the GPU code path) are all real. Only
the engine's choice of words is scripted, which is the one thing that cannot run here: a model that can do
the task.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from agl.types import Call
from tests.controller.conftest import controller
from tests.gateway.stack import stack
from trainer.config import load_config
from trainer.loop import train

ROOT = Path(__file__).resolve().parents[2]


def train_example(
    config: Path,
    tiny_path: Path,
    tmp_path: Path,
    script: list[str],
    *overrides: str,
    steps: int = 2,
    gateway: dict[str, Any] | None = None,
) -> tuple[list[dict], dict[str, list[Call]]]:
    """`steps` training steps of `config` without validation, run from the repository's root (as
    `make` does), with this interpreter's `python` first on PATH; `gateway`: its settings (AIR's).
    Returns the steps' metrics and every rollout's calls."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    with (
        stack(tiny_path, tmp_path, script=script, **(gateway or {})) as gw,
        mock.patch.dict(os.environ, {"PATH": path}),
    ):
        run = [
            *gw.train_overrides(tmp_path / "run"),
            *["agl.val_tasks=", f"trainer.total_training_steps={steps}", "trainer.test_freq=0"],
            *["trainer.val_before_train=false", "trainer.save_freq=-1"],
        ]
        cfg, agl = load_config(ROOT / config, [*run, *overrides])
        with controller(gw, tmp_path, None):
            history = asyncio.run(train(cfg, agl))
        calls = gw.store.calls_for([r.id for r in gw.store.list_rollouts(limit=1000)])
    return [h for h in history if "reward/mean" in h], calls
