"""The splitting experiment: three arms trained afresh on an agent whose rollouts split by design.

- The agent: examples/splitting/harness.py, which rewrites its context after every calculator
  result, so a rollout makes one sample per calculator call plus one.
- The arms `rollout`, `sample` and `mixed` (bench/ablation/training.py), 3 seeds each by default;
  every (arm, seed) of this command trained afresh in this session (its earlier record dropped),
  each a small run: 4 updates of 3 groups x 4 rollouts, greedy validation on the 40 held-out
  tasks after the last one (`--steps`, `--batch-groups`, `--val-tasks`). With 2 groups a step, a
  run could draw only groups whose rollouts all scored alike and train nothing.
- Writes each run's record to `--results` (default `--out`/splitting) and `--out`/ablation.png;
  prints a table: final validation reward (mean and min-max over seeds), entropy at the last
  update over the first, samples per rollout, and the rollout - sample difference against the
  seed-to-seed spread.
- Last line: `ablation_val_rollout=A ablation_val_sample=B ablation_val_mixed=C
  ablation_entropy_ratio_rollout=D ablation_entropy_ratio_sample=E seeds=S samples_per_rollout=F`.
"""

from __future__ import annotations

import argparse
import statistics

from bench.ablation.record import entropy_ratio, path_of, plot, recorded
from bench.ablation.stats import mean_or_nan
from bench.ablation.training import train_missing


def main(args: argparse.Namespace) -> int:
    """Every arm and seed asked for trained in this session, then the table."""
    for seed in args.seeds:
        for arm in args.arms:
            path_of(args.results, arm, seed).unlink(missing_ok=True)
    train_missing(args)
    return report(args)


def report(args: argparse.Namespace) -> int:
    """The table and the last line over the recorded runs; the plot to `args.out`/ablation.png."""
    results = recorded(args)
    plot(results, args.out / "ablation.png")
    summary = {}
    print("| arm | final validation (mean, min-max) | entropy end/start | samples per rollout |")
    print("| --- | --- | --- | --- |")
    for arm, runs in results.items():
        if not runs:
            continue
        final = [r.val_final for r in runs]
        ratio = statistics.mean(entropy_ratio(r.curves["entropy"]) for r in runs)
        spr = mean_or_nan([v for r in runs for v in r.samples_per_rollout])
        summary[arm] = {
            "val": statistics.mean(final),
            "sd": statistics.pstdev(final),
            "ratio": ratio,
            "spr": spr,
        }
        print(
            f"| {arm} | {statistics.mean(final):.3f} ({min(final):.3f}-{max(final):.3f}) "
            f"| {ratio:.3f} | {spr:.2f} |"
        )
    if "rollout" in summary and "sample" in summary:
        diff = summary["rollout"]["val"] - summary["sample"]["val"]
        spread = statistics.mean([summary["rollout"]["sd"], summary["sample"]["sd"]])
        print(
            f"rollout - sample final validation: {diff:+.3f}; "
            f"seed-to-seed sd within an arm: {spread:.3f}"
        )
    print(f"plot: {args.out / 'ablation.png'}")

    def get(arm: str, key: str) -> float:
        return summary.get(arm, {}).get(key, float("nan"))

    spr_all = mean_or_nan([s["spr"] for s in summary.values()])
    print(
        f"ablation_val_rollout={get('rollout', 'val'):.3f} "
        f"ablation_val_sample={get('sample', 'val'):.3f} "
        f"ablation_val_mixed={get('mixed', 'val'):.3f} "
        f"ablation_entropy_ratio_rollout={get('rollout', 'ratio'):.3f} "
        f"ablation_entropy_ratio_sample={get('sample', 'ratio'):.3f} seeds={len(args.seeds)} "
        f"samples_per_rollout={spr_all:.2f}"
    )
    return 0
