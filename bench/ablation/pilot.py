"""The pilot (`--pilot`): how many samples the untrained model's rollouts make, against their reward.

- Trains nothing: starts the engine (`--model`), a gateway and a controller through bench/stack.py
  (no trainer), logging to `--out`/pilot-HARNESS/, on a fresh store there.
- Runs `--pilot-groups` of the training tasks x 4 rollouts (train.yaml's `agl.n`) on the harness
  at the training temperature, and once all have ended splits each one's recorded calls into
  samples with the trainer's own merge (bench/ablation/record.py's `split`).
- Prints how many samples a rollout makes, its reward and how the two correlate (Pearson and
  Spearman), and writes them to `--pilot-out` (default bench/figures/ablation2_pilot.json), beside
  the other harnesses' pilots recorded there.
- Last line: `pilot_samples_per_rollout_mean=M pilot_samples_reward_corr=C pilot_rollouts=N`
  (C: Pearson).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from agl.client import GatewayClient, call_from_json
from agl.types import Rollout
from bench.ablation.record import TEMPERATURE, split
from bench.ablation.stats import correlation, mean_or_nan, rank_correlation
from bench.ablation.training import EXAMPLES, FIGURES, HARNESSES
from bench.stack import ADMIN, ROOT, processes

PILOT_N = 4  # rollouts per task, as train.yaml's agl.n
PILOT_FIGURES = FIGURES / "ablation2_pilot.json"  # the default `--pilot-out`


async def pilot_rollouts(gateway: str, args: argparse.Namespace) -> list[dict]:
    """`args.pilot_groups` training tasks x `PILOT_N` rollouts through the stack, once all have
    ended: each rollout's status, reward, calls and samples (in all and per agent)."""
    harness = HARNESSES[args.harness]
    command = [sys.executable, str(harness.path)]
    spec = {"harness": {"command": command, "env": harness.env, "cwd": str(ROOT)}}
    tasks = (EXAMPLES / "calculator" / "tasks.jsonl").read_text().splitlines()
    groups = [f"pilot/{i}" for i in range(args.pilot_groups)]
    async with GatewayClient(gateway, ADMIN) as gw:
        for group, line in zip(groups, tasks, strict=False):
            for _ in range(PILOT_N):
                await gw.create_rollout(json.loads(line), group, metadata={"spec": spec})
        rollouts: list[Rollout] = []
        while len(rollouts) < len(groups) * PILOT_N or not all(r.status.terminal for r in rollouts):
            await asyncio.sleep(2)
            rollouts = [r for g in groups for r in await gw.list_rollouts(group=g)]
        found = []
        for r in rollouts:
            calls = [call_from_json(c) for c in await gw.calls(r.id)]
            drafts = split(r, calls)
            found.append(
                {
                    "group": r.group,
                    "status": r.status.value,
                    "reward": r.reward,
                    "calls": len(calls),
                    "samples": len(drafts),
                    "samples_per_agent": dict(Counter(d.agent for d in drafts)),
                }
            )
        return found


def write_figures(path: Path, harness: str, figures: dict) -> None:
    """Write a harness's pilot figures to `path`, beside those recorded there for the others."""
    recorded = {}
    if path.exists():
        recorded = json.loads(path.read_text())
    recorded[harness] = figures
    path.write_text(json.dumps(recorded, indent=1) + "\n")


def main(args: argparse.Namespace) -> int:
    """Rollouts of the untrained model: samples per rollout against reward, printed and written."""
    logs = args.out / f"pilot-{args.harness}"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in logs.glob("agl.db*"):  # a fresh store: a rerun's rollouts would mix with these
        stale.unlink()
    started = time.monotonic()
    with processes(logs) as stack:
        stack.start_model_engine(args.model)
        stack.start_gateway()
        stack.start_controller(logs / "controller", "--max-running", "16")
        found = asyncio.run(pilot_rollouts(stack.url, args))
    wall_s = time.monotonic() - started
    ended = [r for r in found if r["status"] == "succeeded" and r["reward"] is not None]
    samples = [float(r["samples"]) for r in ended]
    rewards = [float(r["reward"]) for r in ended]
    figures = {
        "harness": args.harness,
        "model": args.model,
        "temperature": TEMPERATURE,
        "rollouts": len(ended),
        "rollouts_not_scored": len(found) - len(ended),
        "samples_distribution": dict(sorted(Counter(r["samples"] for r in ended).items())),
        "samples_per_rollout_mean": mean_or_nan(samples),
        "reward_mean": mean_or_nan(rewards),
        "pearson": correlation(samples, rewards),
        "spearman": rank_correlation(samples, rewards),
        "reward_mean_by_samples": {
            k: statistics.mean(r["reward"] for r in ended if r["samples"] == k)
            for k in sorted({r["samples"] for r in ended})
        },
        "wall_s": wall_s,
        "per_rollout": found,
    }
    write_figures(args.pilot_out, args.harness, figures)
    print("| samples per rollout | rollouts | mean reward |")
    print("| --- | --- | --- |")
    for k, count in figures["samples_distribution"].items():
        print(f"| {k} | {count} | {figures['reward_mean_by_samples'][k]:.3f} |")
    print(
        f"{args.harness}, untrained {args.model}: {len(ended)} rollouts scored "
        f"({figures['rollouts_not_scored']} not), mean reward {figures['reward_mean']:.3f}; "
        f"samples vs reward: Pearson {figures['pearson']:+.3f}, "
        f"Spearman {figures['spearman']:+.3f}; {wall_s:.0f} s; figures: {args.pilot_out}"
    )
    print(
        f"pilot_samples_per_rollout_mean={figures['samples_per_rollout_mean']:.3f} "
        f"pilot_samples_reward_corr={figures['pearson']:.3f} pilot_rollouts={len(ended)}"
    )
    return 0
