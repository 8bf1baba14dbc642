"""The difficulty probe: the base model k times per task, through agl itself.

- `python -m examples.swe.probe --tasks T.jsonl --k 4 --gateway URL --admin-key K
  [--settings S.yaml] --out probe.json`
- Creates k rollouts per task (mode `val`, group `probe-<instance_id>`, each carrying the task's
  spec from `spec.py`); the running controller (`agl controller`, started without `--spec`) runs
  harness and grader as for training. The engine behind the gateway must serve the base model.
- Waits until all have ended and writes `{"k": k, "rewards": {instance_id: [reward, ...]}}`: one
  reward per rollout that counts (`Rollout.counts`: a task failure without a reward counts 0;
  infra failures and cancelled rollouts are left out).
- It does not decide what to keep (the cleaning pipeline, `tasks.py clean --probe probe.json`,
  keeps the tasks with mixed outcomes) and launches no harness itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from agl.client import GatewayClient
from agl.types import Rollout
from examples.swe.spec import SpecSettings, create_rollouts, load_settings
from examples.swe.tasks import Task, load

PREFIX = "probe-"


async def run_rollouts(
    gw: GatewayClient,
    tasks: list[Task],
    settings: SpecSettings,
    *,
    k: int,
    prefix: str,
    mode: str,
    poll_s: float,
) -> list[Rollout]:
    """Create k rollouts per task (group `<prefix><instance_id>`) and wait until all have ended."""
    pending = set(await create_rollouts(gw, tasks, settings, k=k, prefix=prefix, mode=mode))
    ended: list[Rollout] = []
    while pending:
        found = await asyncio.gather(*(gw.get_rollout(rid) for rid in pending))
        done = [r for r in found if r.status.terminal]
        ended += done
        pending -= {r.id for r in done}
        if pending:
            await asyncio.sleep(poll_s)
    return ended


async def probe(
    gw: GatewayClient, tasks: list[Task], settings: SpecSettings, *, k: int, poll_s: float = 5.0
) -> dict[str, list[float]]:
    """Each task's rewards over its k rollouts (see the module docstring)."""
    ended = await run_rollouts(gw, tasks, settings, k=k, prefix=PREFIX, mode="val", poll_s=poll_s)
    rewards: dict[str, list[float]] = {t.instance_id: [] for t in tasks}
    for r in sorted(ended, key=lambda r: r.created_at):
        if r.counts:
            rewards[r.group.removeprefix(PREFIX)].append(r.reward or 0.0)
    return rewards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.swe.probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tasks", required=True, help="JSONL file or Hugging Face dataset name")
    parser.add_argument("--k", type=int, default=4, help="rollouts per task")
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-key", required=True)
    parser.add_argument(
        "--settings", type=Path, help="SpecSettings as YAML (default: the pod defaults)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    settings = load_settings(args.settings) if args.settings else SpecSettings()

    async def run() -> dict[str, list[float]]:
        async with GatewayClient(args.gateway, args.admin_key) as gw:
            return await probe(gw, load(args.tasks), settings, k=args.k)

    started = time.monotonic()
    rewards = asyncio.run(run())
    args.out.write_text(json.dumps({"k": args.k, "rewards": rewards}, indent=1) + "\n")
    solved = [sum(r >= 1 for r in v) for v in rewards.values()]
    always, never = solved.count(args.k), solved.count(0)
    print(
        f"{len(rewards)} tasks, k={args.k}, {time.monotonic() - started:.0f} s: "
        f"always solved {always}, never {never}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
