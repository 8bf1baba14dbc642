"""`Run`, the ablation's one results record: a finished (arm, seed) training run, a JSON file each.

- `Run`: the run's figures (final validation reward, policy entropy at its first and last update,
  samples per rollout per step, its training rollouts' samples and rewards) and curves, built from
  its metrics history and its store by `summarize`.
- `write`, `read`, `recorded`: the one way results are kept, FOLDER/ARM-SEED.json, written whole
  or not at all and read back only under the settings they were trained with (`settings_of`).
- `split`: a rollout's calls as the trainer splits them into samples, at train.yaml's temperature.
- `plot`: validation reward and policy entropy per step, mean over seeds with the min-max band,
  per arm.
- Not here: training (bench/ablation/training.py), statistics (bench/ablation/stats.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from adapters.merge import Draft, merge
from adapters.settings import AdapterSettings
from agl.store import Store
from agl.types import Call, Mode, Rollout, Status

TEMPERATURE = 0.7  # the harnesses' sampling temperature, and train.yaml's agl.temperature

Curve = list[tuple[float, float]]  # (step, value)


@dataclass
class Run:
    """One finished training run of an arm from a seed, as recorded."""

    arm: str
    seed: int
    settings: dict[str, str | int]  # what makes two runs comparable: `settings_of`
    wall_s: float
    val_final: float  # greedy validation reward after the last update
    val_before: float | None  # before training: the same in every run, so the first measures it
    entropy_first: float | None  # policy entropy at the first update (None: nothing trained)
    entropy_last: float | None
    samples_per_rollout: list[float]  # per step that trained
    curves: dict[str, Curve]  # "val", "entropy", "samples_per_rollout"
    rollouts: list[dict[str, float]]  # each scored training rollout's "samples" and "reward"


def settings_of(args: argparse.Namespace) -> dict[str, str | int]:
    """What makes two runs comparable: a result recorded under other settings is not reused."""
    return {
        "harness": args.harness,
        "model": args.model,
        "steps": args.steps,
        "batch_groups": args.batch_groups,
        "val_tasks": args.val_tasks,
    }


def split(rollout: Rollout, calls: list[Call]) -> list[Draft]:
    """`rollout`'s recorded calls split into samples by the trainer's own merge, as train.yaml
    sets it (temperature, longest sample)."""
    settings = AdapterSettings(temperature=TEMPERATURE, max_length=4096)
    return merge(rollout.id, calls, settings, Counter(), rollout.attempt)


def curves(history: list[dict[str, float]]) -> dict[str, Curve]:
    """(step, value) series from a run's metrics: validation reward, policy entropy, samples per
    rollout."""
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


def entropy_ratio(series: Curve) -> float:
    """Policy entropy at the last update over that at the first."""
    if len(series) < 2:
        return float("nan")
    return series[-1][1] / series[0][1]


def training_rollouts(db: Path) -> list[dict[str, float]]:
    """A finished run's training rollouts that ended scored, from its store: each one's samples
    and reward. Validation rollouts are left out; a rollout launched but never trained on (the last
    steps' spare groups) is kept."""
    with Store(f"sqlite:///{db}") as store:
        ended = [
            r
            for r in store.list_rollouts(status=Status.SUCCEEDED, limit=1_000_000)
            if r.mode is Mode.TRAIN and r.reward is not None
        ]
        calls = store.calls_for([r.id for r in ended])
    return [
        {"samples": float(len(split(r, calls[r.id]))), "reward": float(r.reward or 0.0)}
        for r in ended
    ]


def summarize(arm: str, seed: int, settings: dict[str, str | int], wall_s: float, out: Path) -> Run:
    """The record of the run that examples/demo.py left in `out`: its metrics and its store."""
    history = [
        json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    c = curves(history)
    after = [value for step, value in c["val"] if step > 0]
    before = [value for step, value in c["val"] if step == 0]
    entropy = [value for _, value in c["entropy"]]
    return Run(
        arm=arm,
        seed=seed,
        settings=settings,
        wall_s=wall_s,
        val_final=after[-1],
        val_before=before[0] if before else None,
        entropy_first=entropy[0] if entropy else None,
        entropy_last=entropy[-1] if entropy else None,
        samples_per_rollout=[value for _, value in c["samples_per_rollout"]],
        curves=c,
        rollouts=training_rollouts(out / "agl.db"),
    )


def path_of(folder: Path, arm: str, seed: int) -> Path:
    return folder / f"{arm}-{seed}.json"


def write(folder: Path, run: Run) -> None:
    """`run` to `folder`/ARM-SEED.json, whole or not at all: a run killed mid-write leaves no
    partial record."""
    path = path_of(folder, run.arm, run.seed)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(dataclasses.asdict(run), indent=1) + "\n")
    os.replace(partial, path)


def read(path: Path) -> Run:
    run = Run(**json.loads(path.read_text()))
    run.curves = {key: [(step, value) for step, value in c] for key, c in run.curves.items()}
    return run


def recorded(args: argparse.Namespace) -> dict[str, list[Run]]:
    """The runs of `args.arms` x `args.seeds` recorded in `args.results` under this command's
    settings, per arm, by seed."""
    results: dict[str, list[Run]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            path = path_of(args.results, arm, seed)
            if not path.exists():
                continue
            run = read(path)
            if run.settings == settings_of(args):
                results[arm].append(run)
    return results


def val_before(results: dict[str, list[Run]]) -> float | None:
    """The validation reward before training, from the run that measured it (None: none did)."""
    measured = [r.val_before for runs in results.values() for r in runs if r.val_before is not None]
    return next(iter(measured), None)


def plot(results: dict[str, list[Run]], path: Path) -> None:
    """The runs' validation reward (from before training, where a run measured it) and policy
    entropy per step, mean over seeds with the min-max band, an arm a line; nothing without runs."""
    if not any(results.values()):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = val_before(results)
    fig, axes = plt.subplots(2, 1, figsize=(6.5, 6), sharex=True)
    panels = (("val", "validation reward (greedy)"), ("entropy", "policy entropy"))
    for (key, label), ax in zip(panels, axes, strict=True):
        for arm, runs in results.items():
            by_step: dict[float, list[float]] = {}
            for r in runs:
                series = r.curves[key]
                if key == "val":
                    after = [point for point in series if point[0] > 0]
                    series = after if before is None else [(0.0, before), *after]
                for step, value in series:
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
