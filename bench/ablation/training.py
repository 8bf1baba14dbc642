"""The ablation's training runs: the agents, the arms, and each (arm, seed) trained from scratch.

- `HARNESSES`: the agents trained (the splitting and the compacting calculator agents, the latter
  also with its summaries delegated to a sub-agent), each with its experiment's default seeds and
  arms.
- `ARMS`: each arm's trainer settings: `rollout`, one advantage per rollout broadcast to its
  samples with rollout-level loss weights (agl's default); `sample`, every sample its own group
  member (naive transition-level GRPO) with verl's token-mean; `mixed`, rollout-level advantage
  with token-mean.
- `train`: one run, examples/demo.py from scratch in a process of its own (bench/stack.py), with
  greedy validation on the held-out tasks after its last update (and before its first, if asked).
- `train_missing`: every (arm, seed) not yet recorded, seed by seed with the arms interleaved, so
  a slow phase of the machine falls on all arms alike; each run recorded as soon as it ends
  (bench/ablation/record.py), its weights then removed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

from bench.ablation.record import path_of, read, recorded, settings_of, summarize, write
from bench.stack import ROOT, run_logged

EXAMPLES = ROOT / "examples"
FIGURES = ROOT / "bench" / "figures"


class Harness(NamedTuple):
    """An agent to train: its script, the environment it runs with, and its experiment's default
    seeds and arms."""

    path: Path
    env: dict[str, str]
    seeds: int
    arms: tuple[str, ...]


# The compacting experiment's seeds per arm, for 80% power at a 0.05 difference (two-sided 5%).
# Its pilot (seeds 0 and 1 of each arm, 2026-12-04; bench/figures/ablation2/power.json) spread by
# a pooled sd of 0.0125, which asks for 3; but two seeds an arm give that sd 2 degrees of freedom,
# and its 90% upper confidence bound, 0.039, asks for 11, the earlier bench's sd of 0.04 for 12.
# After 8 seeds an arm (2026-12-04; bench/figures/ablation2/power_at_8_seeds.json) the pooled sd
# was 0.046 on 14 degrees of freedom, which asks for 15: raised to 15. The new number comes from
# the spread alone, not from the difference between the arms, so it does not bias the test.
COMPACTING_SEEDS = 15
HARNESSES = {
    "splitting": Harness(
        path=EXAMPLES / "splitting" / "harness.py",
        env={},
        seeds=3,
        arms=("rollout", "sample", "mixed"),
    ),
    "compacting": Harness(
        path=EXAMPLES / "compacting" / "harness.py",
        env={},
        seeds=COMPACTING_SEEDS,
        arms=("rollout", "sample"),
    ),
    "compacting-subagent": Harness(
        path=EXAMPLES / "compacting" / "harness.py",
        env={"AGL_SUBAGENT": "1"},
        seeds=COMPACTING_SEEDS,
        arms=("rollout", "sample"),
    ),
}
ARMS = {
    "rollout": ["agl.advantage_level=rollout", "agl.loss_mode=rollout"],
    "sample": ["agl.advantage_level=sample", "agl.loss_mode=token-mean"],
    "mixed": ["agl.advantage_level=rollout", "agl.loss_mode=token-mean"],
}


def train(arm: str, seed: int, out: Path, args: argparse.Namespace, val_first: bool) -> None:
    """One training run from scratch into `out`, its output to `out`'s sibling ARM-seedN.log."""
    harness = HARNESSES[args.harness]
    demo = [
        *[sys.executable, str(EXAMPLES / "demo.py"), "--seed", str(seed)],
        *["--out", str(out), "--harness", str(harness.path)],
        *["--model", args.model],
        *[f"++agl.spec.harness.env.{name}='{value}'" for name, value in harness.env.items()],
        *ARMS[arm],
        *[f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.steps}"],
        "trainer.save_freq=-1",
        *[f"agl.batch_groups={args.batch_groups}", f"agl.active_groups={args.batch_groups + 1}"],
        f"agl.val_tasks={args.out / 'val.jsonl'}",
        f"trainer.val_before_train={str(val_first).lower()}",
        f"trainer.experiment_name=ablation-{arm}-{seed}",
    ]
    if args.steps <= 2:  # not past train.yaml's learning-rate warm-up (2 steps), which verl refuses
        demo.append("actor_rollout_ref.actor.optim.lr_warmup_steps=0")
    log = out.parent / f"{arm}-seed{seed}.log"
    code = run_logged(demo, log)
    if code != 0:
        raise SystemExit(f"{arm} seed {seed}: the demo exited with {code}; see {log}")


def train_missing(args: argparse.Namespace) -> None:
    """Train every (arm, seed) of `args.arms` x `args.seeds` not recorded in `args.results`, seed
    by seed with the arms interleaved, each recorded as soon as it ends. A record of one of them
    under other settings stops it: pass another `--results`."""
    args.results.mkdir(parents=True, exist_ok=True)
    settings = settings_of(args)
    started = time.monotonic()
    for seed in args.seeds:
        for arm in args.arms:
            path = path_of(args.results, arm, seed)
            if path.exists():
                other = read(path).settings
                if other != settings:
                    raise SystemExit(f"{path} was run with {other}; pass another --results")
                continue
            # Greedy validation before training is the same in every run: the first run measures it.
            runs = [r for arm_runs in recorded(args).values() for r in arm_runs]
            val_first = all(r.val_before is None for r in runs)
            t0 = time.monotonic()
            out = args.out / f"{arm}-seed{seed}"
            train(arm, seed, out, args, val_first=val_first)
            run = summarize(arm, seed, settings, time.monotonic() - t0, out)
            write(args.results, run)
            # The last two versions' weights (about 1 GB a run) serve nothing once it is recorded.
            shutil.rmtree(out / "train" / "weights", ignore_errors=True)
            val = ", ".join(f"{value:.3f}" for _, value in run.curves["val"])
            print(f"{arm} seed {seed}: validation {val}; {run.wall_s:.0f} s", flush=True)
    print(f"{time.monotonic() - started:.0f} s training; results: {args.results}")
