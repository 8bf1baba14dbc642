"""Evaluation: validation rollouts through agl, `preds.json` from their patches, and the command
that scores it with the official SWE-bench harness.

- `python -m examples.swe.evaluate --tasks validation.jsonl --gateway URL --admin-key K
  --name NAME [--settings S.yaml] [--k 1] [--collect-only] --out preds.json`
- Creates k rollouts per task (mode `val`, group `val-<instance_id>`) for the running controller
  and waits for them; `--collect-only` skips launching and reads the rollouts already in those
  groups.
- Writes `preds.json` in the form the `swebench` harness and mini-swe-agent use:
  `{instance_id: {"instance_id", "model_name_or_path", "model_patch"}}`, the patch being the
  `swe_patch` event the grader posted for the task's first rollout that counts (`Rollout.counts`).
- Prints agl's own Pass@1 (mean grader reward), which for SWE-smith tasks is the score; for
  SWE-bench Verified the official score comes from (x86_64 with Docker, images pulled from Docker
  Hub):

      python -m swebench.harness.run_evaluation --dataset_name princeton-nlp/SWE-bench_Verified \\
          --split test --predictions_path preds.json --max_workers 8 --run_id NAME
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agl.client import GatewayClient
from examples.swe.probe import run_rollouts
from examples.swe.spec import SpecSettings, load_settings
from examples.swe.tasks import Task, load

PREFIX = "val-"


async def collect(
    gw: GatewayClient, tasks: list[Task], name: str, prefix: str = PREFIX
) -> tuple[dict, float]:
    """(preds, Pass@1): each task's first counted rollout's patch; the mean reward over all counted
    rollouts."""
    preds: dict[str, dict[str, Any]] = {}
    rewards: list[float] = []
    for task in tasks:
        listed = await gw.list_rollouts(group=prefix + task.instance_id)
        rollouts = sorted(listed, key=lambda r: r.created_at)
        ran = [r for r in rollouts if r.counts]
        rewards += [r.reward or 0.0 for r in ran]
        for r in ran:
            patches = [e["data"] for e in await gw.events(r.id) if e["kind"] == "swe_patch"]
            if patches:
                preds[task.instance_id] = {
                    "instance_id": task.instance_id,
                    "model_name_or_path": name,
                    "model_patch": patches[-1]["model_patch"],
                }
                break
    return preds, sum(rewards) / len(rewards) if rewards else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.swe.evaluate", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--tasks", required=True, help="validation tasks: JSONL or Hugging Face dataset name"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--name", required=True, help="model_name_or_path in preds.json")
    parser.add_argument(
        "--settings", type=Path, help="SpecSettings as YAML (default: the pod defaults)"
    )
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--collect-only", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("preds.json"))
    args = parser.parse_args(argv)
    tasks = load(args.tasks, args.split)
    settings = load_settings(args.settings) if args.settings else SpecSettings()

    async def run() -> tuple[dict, float]:
        async with GatewayClient(args.gateway, args.admin_key) as gw:
            if not args.collect_only:
                await run_rollouts(
                    gw, tasks, settings, k=args.k, prefix=PREFIX, mode="val", poll_s=10.0
                )
            return await collect(gw, tasks, args.name)

    preds, pass_at_1 = asyncio.run(run())
    args.out.write_text(json.dumps(preds, indent=1) + "\n")
    print(
        f"{len(preds)}/{len(tasks)} tasks with a patch in {args.out}; "
        f"agl Pass@1 (grader reward) {pass_at_1:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
