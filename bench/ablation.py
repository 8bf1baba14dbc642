"""Rollout-level against sample-level handling, trained side by side on a harness whose rollouts split.

`python -m bench.ablation` trains the splitting calculator agent (`examples/splitting/harness.py`:
it rewrites its context after every calculator result, so a rollout makes one sample per
calculator call plus one) with three arms, each from scratch through `examples/demo.py`:
- `rollout`: one advantage per rollout, broadcast to its samples, and rollout-level loss weights
  (agl's default);
- `sample`: every sample its own group member (naive transition-level GRPO) and verl's token-mean;
- `mixed`: rollout-level advantage and token-mean.
Runs are interleaved (seed 0 of every arm, then seed 1, ...), so a slow phase of the machine
falls on all arms alike. Each run is small (4 updates of 3 groups x 4 rollouts, greedy
validation on the 40 held-out tasks after the last one): with 2 groups a step, a run could
draw only groups whose rollouts all scored alike and train nothing (2026-12-02: one of four runs
did). `--steps`, `--batch-groups` and `--val-tasks` make them bigger. Validation before
training is greedy from the same weights, the same in every run, so only the first run measures
it and every curve starts from it. Writes `ablation.png` (validation reward and policy entropy
per step, mean over seeds with the min-max band, per arm) and `results.json`, and prints a
table: final validation reward (mean and spread over seeds), entropy at the last update relative
to the first, samples per rollout, and the rollout-vs-sample difference against the seed-to-seed
spread.
Last line: `ablation_val_rollout=A ablation_val_sample=B ablation_val_mixed=C
ablation_entropy_ratio_rollout=D ablation_entropy_ratio_sample=E seeds=S samples_per_rollout=F`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.quick import parse_args

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "rollout": ["agl.advantage_level=rollout", "agl.loss_mode=rollout"],
    "sample": ["agl.advantage_level=sample", "agl.loss_mode=token-mean"],
    "mixed": ["agl.advantage_level=rollout", "agl.loss_mode=token-mean"],
}


def run(
    arm: str, seed: int, out: Path, args: argparse.Namespace, val_first: bool
) -> list[dict[str, float]]:
    """One training run from scratch; its metrics history."""
    demo = [
        *[sys.executable, str(ROOT / "examples" / "demo.py"), "--seed", str(seed)],
        *["--out", str(out), "--harness", str(ROOT / "examples" / "splitting" / "harness.py")],
        *["--model", args.model],
        *ARMS[arm],
        *[f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.steps}"],
        "trainer.save_freq=-1",
        *[f"agl.batch_groups={args.batch_groups}", f"agl.active_groups={args.batch_groups + 1}"],
        f"agl.val_tasks={args.out / 'val.jsonl'}",
        f"trainer.val_before_train={str(val_first).lower()}",
        f"trainer.experiment_name=ablation-{arm}-{seed}",
    ]
    log_path = out.parent / f"{arm}-seed{seed}.log"
    with log_path.open("wb") as log:
        code = subprocess.run(demo, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"{arm} seed {seed}: the demo exited with {code}; see {log_path}")
    return [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]


def curves(history: list[dict[str, float]]) -> dict[str, list[tuple[float, float]]]:
    """(step, value) series: validation reward, policy entropy, samples per rollout."""
    steps = [h for h in history if "reward/mean" in h]
    return {
        "val": [(h["val/step"], h["val/reward_mean"]) for h in history if "val/reward_mean" in h],
        "entropy": [
            (float(i), h["actor/entropy"]) for i, h in enumerate(steps, 1) if "actor/entropy" in h
        ],
        "samples_per_rollout": [
            (float(i), h["adapter/samples_per_rollout"])
            for i, h in enumerate(steps, 1)
            if h.get("adapter/rollouts_trained")
        ],
    }


def entropy_ratio(series: list[tuple[float, float]]) -> float:
    """Policy entropy at the last update over that at the first."""
    return series[-1][1] / series[0][1] if len(series) >= 2 else float("nan")


def mean_or_nan(values: list[float]) -> float:
    """The mean; NaN for none (a run whose every group scored alike trains nothing)."""
    if not values:
        return float("nan")
    return statistics.mean(values)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(6.5, 6), sharex=True)
    panels = (("val", "validation reward (greedy)"), ("entropy", "policy entropy"))
    for (key, label), ax in zip(panels, axes, strict=True):
        for arm, runs in results.items():
            by_step: dict[float, list[float]] = {}
            for r in runs:
                for step, value in r["curves"][key]:
                    by_step.setdefault(step, []).append(value)
            xs = sorted(by_step)
            ax.plot(xs, [statistics.mean(by_step[x]) for x in xs], marker="o", label=arm)
            ax.fill_between(
                xs, [min(by_step[x]) for x in xs], [max(by_step[x]) for x in xs], alpha=0.15
            )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[-1].set_xlabel("step")
    fig.suptitle("rollout- vs sample-level handling (mean over seeds, min-max band)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=4, help="training steps (updates) per run")
    parser.add_argument("--batch-groups", type=int, default=3, help="groups of 4 rollouts per step")
    parser.add_argument(
        "--val-tasks", type=int, default=40, help="held-out tasks validated on (of 40)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    parser.add_argument("--model", default="smollm2", help="the engine's model (examples/demo.py)")
    args = parse_args(
        parser,
        seeds=[0],
        arms=["rollout", "sample"],
        steps=3,
        batch_groups=1,
        val_tasks=4,
        model="tiny",
    )
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    val_path = ROOT / "examples" / "calculator" / "val.jsonl"
    val = val_path.read_text().splitlines()[: args.val_tasks]
    (args.out / "val.jsonl").write_text("\n".join(val) + "\n")
    started = time.monotonic()
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    before: tuple[float, float] | None = None  # (0, validation before training), from the first run
    for seed in args.seeds:
        for arm in args.arms:
            t0 = time.monotonic()
            history = run(arm, seed, args.out / f"{arm}-seed{seed}", args, val_first=before is None)
            c = curves(history)
            before = before or c["val"][0]
            c["val"] = [before, *[v for v in c["val"] if v[0] > 0]]
            results[arm].append({"seed": seed, "curves": c, "wall_s": time.monotonic() - t0})
            val = ", ".join(f"{v:.3f}" for _, v in c["val"])
            print(f"{arm} seed {seed}: validation {val}; {time.monotonic() - t0:.0f} s", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "ablation.png")

    summary = {}
    print("| arm | final validation (mean, min-max) | entropy end/start | samples per rollout |")
    print("| --- | --- | --- | --- |")
    for arm, runs in results.items():
        final = [r["curves"]["val"][-1][1] for r in runs]
        ratio = statistics.mean(entropy_ratio(r["curves"]["entropy"]) for r in runs)
        spr = mean_or_nan([v for r in runs for _, v in r["curves"]["samples_per_rollout"]])
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
    print(f"plot: {args.out / 'ablation.png'}; {time.monotonic() - started:.0f} s in all")

    def get(arm: str, key: str) -> float:
        return summary.get(arm, {}).get(key, float("nan"))

    spr_all = statistics.mean(s["spr"] for s in summary.values())
    print(
        f"ablation_val_rollout={get('rollout', 'val'):.3f} "
        f"ablation_val_sample={get('sample', 'val'):.3f} "
        f"ablation_val_mixed={get('mixed', 'val'):.3f} "
        f"ablation_entropy_ratio_rollout={get('rollout', 'ratio'):.3f} "
        f"ablation_entropy_ratio_sample={get('sample', 'ratio'):.3f} seeds={len(args.seeds)} "
        f"samples_per_rollout={spr_all:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
