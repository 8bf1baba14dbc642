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

`--harness compacting` trains the compacting calculator agent instead
(`examples/compacting/harness.py`: one conversation, compacted past a prompt length, so a long
attempt splits into more samples than a quick one); `compacting-subagent` is the same with its
summaries delegated to a sub-agent of another name. `--pilot` trains nothing: it starts the stack
(engine, gateway, controller; no trainer), runs `--pilot-groups` of the training tasks x 4
rollouts of the untrained model at the training temperature, splits each rollout's recorded calls
into samples with the trainer's own merge (`adapters.merge`), and prints how many samples a rollout
makes, its reward, and how the two correlate (Pearson and Spearman), to
`bench/figures/ablation2_pilot.json` too. Last line: `pilot_samples_per_rollout_mean=M
pilot_samples_reward_corr=C pilot_rollouts=N` (C: Pearson).

Without `--pilot`, a compacting harness trains the arms `rollout` and `sample` (15 seeds each by
default: the power analysis on the spread of the first 8,
bench/figures/ablation2/power_at_8_seeds.json), interleaved by seed as above, and the experiment is
resumable: each finished (arm, seed) run's figures (final validation reward, policy entropy at its
first and last update, samples per rollout per step, its training rollouts' samples and rewards
read from its store) are written at once to `--results`/ARM-SEED.json (default
`bench/figures/ablation2/HARNESS/`, kept in the repository), and a rerun skips every run recorded
there under the same settings. A run killed midway leaves no file.
Then it reports on every recorded run of `--seeds` x `--arms`: final validation reward per arm
(mean, sd), the rollout - sample difference with its 95% confidence interval (Welch's t), entropy
at the last update over the first, samples per rollout and their Pearson correlation with reward
over the runs' training rollouts, and the seeds per arm that the spread so far asks for (80% power
at a 0.05 difference, two-sided 5%); to `--results`.json and .png too, and the power analysis to
`--power` if given (`--report`: this report alone, training nothing). Last line:
`ablation2_val_rollout=A ablation2_val_sample=B ablation2_diff_ci_low=L ablation2_diff_ci_high=H
ablation2_entropy_ratio_rollout=E1 ablation2_entropy_ratio_sample=E2 seeds=N
samples_per_rollout_mean=M samples_reward_corr=C`
(N: the fewest seeds recorded for an arm; nan where a figure needs more seeds). `--quick` is one
seed, one step, its results under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import scipy.stats

from adapters.merge import merge
from adapters.settings import AdapterSettings
from agl.client import GatewayClient, call_from_json
from agl.store import Store
from agl.types import Mode, Rollout, Status
from bench.gateway import ADMIN, free_port, wait
from bench.quick import parse_args

ROOT = Path(__file__).resolve().parents[1]


class Harness(NamedTuple):
    """An agent to train: its script, the environment it runs with, and its experiment's default
    seeds and arms."""

    path: Path
    env: dict[str, str]
    seeds: int
    arms: tuple[str, ...]


EXAMPLES = ROOT / "examples"
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
FIGURES = ROOT / "bench" / "figures"
TEMPERATURE = 0.7  # the harnesses' sampling temperature, and train.yaml's agl.temperature
PILOT_N = 4  # rollouts per task, as train.yaml's agl.n
ARMS = {
    "rollout": ["agl.advantage_level=rollout", "agl.loss_mode=rollout"],
    "sample": ["agl.advantage_level=sample", "agl.loss_mode=token-mean"],
    "mixed": ["agl.advantage_level=rollout", "agl.loss_mode=token-mean"],
}


def run(
    arm: str, seed: int, out: Path, args: argparse.Namespace, val_first: bool
) -> list[dict[str, float]]:
    """One training run from scratch; its metrics history."""
    harness = HARNESSES[args.harness]
    demo = [
        *[sys.executable, str(ROOT / "examples" / "demo.py"), "--seed", str(seed)],
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


@contextlib.contextmanager
def stack(model: str, logs: Path) -> Iterator[str]:
    """The engine, gateway and controller as real processes on 127.0.0.1 (no trainer), each
    logging to `logs`; yields the gateway's URL and stops them on the way out."""
    engine_port, gateway_port = free_port(), free_port()
    engine_url, gateway_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
    db = logs / "agl.db"
    for stale in (db, logs / "agl.db-wal", logs / "agl.db-shm"):
        stale.unlink(missing_ok=True)
    commands = {
        "engine": ["engine", "--model", model, "--port", str(engine_port)],
        "gateway": [
            *["gateway", "--engine-url", engine_url, "--port", str(gateway_port)],
            *["--admin-key", ADMIN, "--db", f"sqlite:///{db}"],
        ],
        "controller": [
            *["controller", "--gateway", gateway_url, "--admin-key", ADMIN],
            *["--launcher", "local", "--state-dir", str(logs / "controller")],
            *["--max-running", "16"],
        ],
    }
    ready = {"engine": engine_url + "/health", "gateway": gateway_url + "/healthz"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in commands.items():
            with (logs / f"{name}.log").open("wb") as log:
                command = [sys.executable, "-m", "agl.cli", *argv]
                procs.append(subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT))
            if name in ready:
                wait(ready[name])
        yield gateway_url
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


async def pilot_rollouts(gateway: str, args: argparse.Namespace) -> list[dict]:
    """`args.pilot_groups` training tasks x `PILOT_N` rollouts through the stack, once all have
    ended: each rollout's status, reward, calls and samples (in all and per agent)."""
    harness = HARNESSES[args.harness]
    command = [sys.executable, str(harness.path)]
    spec = {"harness": {"command": command, "env": harness.env, "cwd": str(ROOT)}}
    tasks = (EXAMPLES / "calculator" / "tasks.jsonl").read_text().splitlines()
    groups = [f"pilot/{i}" for i in range(args.pilot_groups)]
    settings = AdapterSettings(temperature=TEMPERATURE, max_length=4096)  # as train.yaml's
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
            drafts = merge(r.id, calls, settings, Counter(), r.attempt)
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


def correlation(xs: list[float], ys: list[float]) -> float:
    """Pearson's r; NaN when either side is constant (or too short)."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return float("nan")


def rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho (ties share their mean rank); NaN when either side is constant."""
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return float("nan")
    return float(scipy.stats.spearmanr(xs, ys).statistic)


def record(path: Path, harness: str, figures: dict) -> None:
    """Write a harness's pilot figures to `path`, beside those recorded there for the others."""
    recorded = {}
    if path.exists():
        recorded = json.loads(path.read_text())
    recorded[harness] = figures
    path.write_text(json.dumps(recorded, indent=1) + "\n")


def pilot(args: argparse.Namespace) -> int:
    """Rollouts of the untrained model: samples per rollout against reward, printed and written."""
    logs = args.out / f"pilot-{args.harness}"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with stack(args.model, logs) as gateway:
        found = asyncio.run(pilot_rollouts(gateway, args))
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
    record(args.pilot_out, args.harness, figures)
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


# ------------------------------------------------------------------ the compacting experiment


def settings_of(args: argparse.Namespace) -> dict[str, str | int]:
    """What makes two runs comparable: a result recorded under other settings is not reused."""
    return {
        "harness": args.harness,
        "model": args.model,
        "steps": args.steps,
        "batch_groups": args.batch_groups,
        "val_tasks": args.val_tasks,
    }


def training_rollouts(db: Path) -> list[dict[str, float]]:
    """A finished run's training rollouts that ended scored, from its store: each one's samples
    (split by the trainer's own merge, as the pilot does) and reward. Validation rollouts are left
    out; a rollout launched but never trained on (the last steps' spare groups) is kept."""
    settings = AdapterSettings(temperature=TEMPERATURE, max_length=4096)  # as train.yaml's
    with Store(f"sqlite:///{db}") as store:
        ended = [
            r
            for r in store.list_rollouts(status=Status.SUCCEEDED, limit=1_000_000)
            if r.mode is Mode.TRAIN and r.reward is not None
        ]
        calls = store.calls_for([r.id for r in ended])
    pairs = []
    for r in ended:
        drafts = merge(r.id, calls[r.id], settings, Counter(), r.attempt)
        pairs.append({"samples": float(len(drafts)), "reward": float(r.reward or 0.0)})
    return pairs


def summarize(history: list[dict[str, float]], out: Path) -> dict:
    """One finished run's figures: final validation reward, policy entropy at its first and last
    update, samples per rollout per step, and its rollouts' (samples, reward) pairs."""
    c = curves(history)
    after = [value for step, value in c["val"] if step > 0]
    before = [value for step, value in c["val"] if step == 0]
    entropy = [value for _, value in c["entropy"]]
    return {
        "val_final": after[-1],
        "val_before": before[0] if before else None,
        "entropy_first": entropy[0] if entropy else None,
        "entropy_last": entropy[-1] if entropy else None,
        "samples_per_rollout": [value for _, value in c["samples_per_rollout"]],
        "curves": c,
        "rollouts": training_rollouts(out / "agl.db"),
    }


def write_at_once(path: Path, figures: dict) -> None:
    """Write `path` whole or not at all: a run killed mid-write leaves no partial result."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(figures, indent=1) + "\n")
    os.replace(partial, path)


def load_results(args: argparse.Namespace) -> dict[str, list[dict]]:
    """The recorded runs of `args.arms` x `args.seeds` under this run's settings, per arm."""
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            path = args.results / f"{arm}-{seed}.json"
            if not path.exists():
                continue
            recorded = json.loads(path.read_text())
            if recorded["settings"] == settings_of(args):
                results[arm].append(recorded)
    return results


def experiment(args: argparse.Namespace) -> int:
    """Train every (arm, seed) not yet recorded under `args.results`, seed by seed with the arms
    interleaved, each run's figures written as soon as it ends; then report on all recorded."""
    args.results.mkdir(parents=True, exist_ok=True)
    settings = settings_of(args)
    started = time.monotonic()
    for seed in args.seeds:
        for arm in args.arms:
            path = args.results / f"{arm}-{seed}.json"
            if path.exists():
                recorded = json.loads(path.read_text())["settings"]
                if recorded != settings:
                    raise SystemExit(f"{path} was run with {recorded}; pass another --results")
                continue
            # Greedy validation before training is the same in every run: the first run measures it.
            val_first = not any(
                json.loads(p.read_text())["val_before"] is not None
                for p in args.results.glob("*.json")
            )
            t0 = time.monotonic()
            out = args.out / f"{arm}-seed{seed}"
            history = run(arm, seed, out, args, val_first=val_first)
            figures = summarize(history, out)
            wall_s = time.monotonic() - t0
            write_at_once(
                path, {"arm": arm, "seed": seed, "settings": settings, "wall_s": wall_s} | figures
            )
            # The last two versions' weights (about 1 GB a run) serve nothing once the run's
            # figures are written.
            shutil.rmtree(out / "train" / "weights", ignore_errors=True)
            print(
                f"{arm} seed {seed}: final validation {figures['val_final']:.3f}; {wall_s:.0f} s",
                flush=True,
            )
    print(f"{time.monotonic() - started:.0f} s training; results: {args.results}")
    return report(args)


def welch(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of `a` minus mean of `b`, and Welch's t confidence interval for it (unequal variances);
    NaN bounds with fewer than two values on a side, the difference itself when neither varies."""
    nan = float("nan")
    diff = mean_or_nan(a) - mean_or_nan(b)
    if len(a) < 2 or len(b) < 2:
        return diff, nan, nan
    if statistics.variance(a) == 0 and statistics.variance(b) == 0:
        return diff, diff, diff
    test = scipy.stats.ttest_ind(a, b, equal_var=False)
    interval = test.confidence_interval(confidence_level=level)
    return diff, float(interval.low), float(interval.high)


def seeds_for_power(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Seeds per arm for a two-sided two-sample t test at `alpha` to detect a difference `delta`
    with `power`, given the seed-to-seed sd: the smallest n with
    n >= 2 (t(1 - alpha/2, 2n - 2) + t(power, 2n - 2))^2 sd^2 / delta^2
    (the normal-approximation formula with t quantiles, iterated; at most 1000)."""
    n = 2
    while n < 1000:
        df = 2 * n - 2
        quantiles = scipy.stats.t.ppf(1 - alpha / 2, df) + scipy.stats.t.ppf(power, df)
        needed = 2 * quantiles**2 * sd**2 / delta**2
        if n >= needed:
            break
        n += 1
    return n


def sd_or_nan(values: list[float]) -> float:
    """The sample standard deviation; NaN for fewer than two values."""
    if len(values) < 2:
        return float("nan")
    return statistics.stdev(values)


def power_analysis(finals: dict[str, list[float]], delta: float) -> dict:
    """Seeds per arm for 80% power at a difference `delta` (two-sided, 5%), from the pooled
    seed-to-seed sd of the final validation reward in the runs so far, and from that sd's 90% upper
    confidence bound (chi-square): a few seeds estimate an sd loosely, and planning on the point
    estimate would too often leave the experiment short."""
    sds = {arm: sd_or_nan(values) for arm, values in finals.items()}
    df = sum(len(values) - 1 for values in finals.values() if len(values) >= 2)
    figures = {
        "delta": delta,
        "alpha": 0.05,
        "power": 0.8,
        "formula": "smallest n with n >= 2 (t(1-alpha/2, 2n-2) + t(power, 2n-2))^2 sd^2 / delta^2",
        "seeds_used": {arm: len(values) for arm, values in finals.items()},
        "sd_per_arm": sds,
        "sd_pooled": float("nan"),
        "sd_pooled_df": df,
        "sd_upper_90": float("nan"),
        "seeds_per_arm": None,
        "seeds_per_arm_at_upper_90": None,
        "seeds_planned": COMPACTING_SEEDS,
    }
    if df == 0:
        return figures
    pooled = math.sqrt(
        sum((len(finals[arm]) - 1) * sd**2 for arm, sd in sds.items() if math.isfinite(sd)) / df
    )
    upper = pooled * math.sqrt(df / scipy.stats.chi2.ppf(0.10, df))
    figures["sd_pooled"] = pooled
    figures["sd_upper_90"] = upper
    figures["seeds_per_arm"] = seeds_for_power(pooled, delta)
    figures["seeds_per_arm_at_upper_90"] = seeds_for_power(upper, delta)
    return figures


def samples_and_rewards(results: dict[str, list[dict]], harness: str) -> tuple[list, list, str]:
    """Every recorded run's training rollouts as (samples, reward) lists and where they came from;
    the untrained pilot's rollouts when no run recorded any."""
    pairs = [pair for runs in results.values() for r in runs for pair in r["rollouts"]]
    source = "the runs' training rollouts"
    if not pairs:
        pilot_path = FIGURES / "ablation2_pilot.json"
        pairs = json.loads(pilot_path.read_text()).get(harness, {}).get("per_rollout", [])
        pairs = [p for p in pairs if p["status"] == "succeeded" and p["reward"] is not None]
        source = f"the untrained pilot ({pilot_path.name})"
    samples = [float(p["samples"]) for p in pairs]
    rewards = [float(p["reward"]) for p in pairs]
    return samples, rewards, source


def arm_table(results: dict[str, list[dict]]) -> dict[str, dict]:
    """Per arm: its seeds, final validation reward (mean, sd), policy entropy at the first and last
    update (means) and their ratio (mean over runs), samples per rollout; printed as a table."""
    arms = {}
    print(
        "| arm | seeds | final validation (mean, sd) | entropy first -> last | end/start "
        "| samples per rollout |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for arm, runs in results.items():
        finals = [r["val_final"] for r in runs]
        ratios = [entropy_ratio(r["curves"]["entropy"]) for r in runs]
        a = {
            "seeds": [r["seed"] for r in runs],
            "val_final": finals,
            "val_mean": mean_or_nan(finals),
            "val_sd": sd_or_nan(finals),
            "entropy_first": mean_or_nan([r["entropy_first"] for r in runs if r["entropy_first"]]),
            "entropy_last": mean_or_nan([r["entropy_last"] for r in runs if r["entropy_last"]]),
            "entropy_ratio": mean_or_nan([x for x in ratios if math.isfinite(x)]),
            "samples_per_rollout": mean_or_nan([v for r in runs for v in r["samples_per_rollout"]]),
        }
        arms[arm] = a
        print(
            f"| {arm} | {len(runs)} | {a['val_mean']:.3f} ({a['val_sd']:.3f}) "
            f"| {a['entropy_first']:.3f} -> {a['entropy_last']:.3f} | {a['entropy_ratio']:.3f} "
            f"| {a['samples_per_rollout']:.2f} |"
        )
    return arms


def report(args: argparse.Namespace) -> int:
    """Per arm: final validation reward (mean, sd), entropy end/start, samples per rollout; the
    rollout - sample difference with Welch's 95% interval; samples vs reward; the power analysis.
    Printed, and written beside the results (`<results>.json`, `<results>.png`)."""
    results = load_results(args)
    befores = [r["val_before"] for runs in results.values() for r in runs]
    before = next((v for v in befores if v is not None), None)
    arms = arm_table(results)
    finals = {arm: a["val_final"] for arm, a in arms.items()}
    diff, low, high = welch(finals.get("rollout", []), finals.get("sample", []))
    samples, rewards, source = samples_and_rewards(results, args.harness)
    corr = correlation(samples, rewards)
    power = power_analysis(finals, delta=0.05)
    spr_all = mean_or_nan(
        [v for runs in results.values() for r in runs for v in r["samples_per_rollout"]]
    )
    if before is not None:
        print(f"validation before training (greedy, untrained): {before:.3f}")
    print(
        f"rollout - sample final validation: {diff:+.3f}, 95% CI (Welch t) [{low:+.3f}, {high:+.3f}]"
    )
    print(f"samples vs reward over {len(samples)} rollouts of {source}: Pearson {corr:+.3f}")
    print(
        f"power (80% at a 0.05 difference, two-sided 5%): pooled seed-to-seed sd "
        f"{power['sd_pooled']:.3f} ({power['sd_pooled_df']} df) asks for {power['seeds_per_arm']} "
        f"seeds per arm, its 90% upper bound {power['sd_upper_90']:.3f} for "
        f"{power['seeds_per_arm_at_upper_90']}; {len(args.seeds)} asked for"
    )
    figures = {
        "settings": settings_of(args),
        "arms": arms,
        "val_before": before,
        "diff_rollout_minus_sample": diff,
        "diff_ci95_welch": [low, high],
        "samples_reward_pearson": corr,
        "samples_reward_spearman": rank_correlation(samples, rewards),
        "samples_reward_source": source,
        "samples_reward_rollouts": len(samples),
        "samples_per_rollout_mean": spr_all,
        "power": power,
    }
    args.results.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
    if args.power:
        args.power.write_text(json.dumps(power, indent=1) + "\n")
    plot_results(results, before, args.results.with_suffix(".png"))
    seeds = min((len(runs) for runs in results.values()), default=0)

    def get(arm: str, key: str) -> float:
        return arms.get(arm, {}).get(key, float("nan"))

    print(
        f"ablation2_val_rollout={get('rollout', 'val_mean'):.3f} "
        f"ablation2_val_sample={get('sample', 'val_mean'):.3f} "
        f"ablation2_diff_ci_low={low:.3f} ablation2_diff_ci_high={high:.3f} "
        f"ablation2_entropy_ratio_rollout={get('rollout', 'entropy_ratio'):.3f} "
        f"ablation2_entropy_ratio_sample={get('sample', 'entropy_ratio'):.3f} seeds={seeds} "
        f"samples_per_rollout_mean={spr_all:.2f} samples_reward_corr={corr:.3f}"
    )
    return 0


def plot_results(results: dict[str, list[dict]], before: float | None, path: Path) -> None:
    """The recorded runs' curves as `plot` draws them, each validation curve starting from the
    validation before training where a run measured it."""
    drawn: dict[str, list[dict]] = {}
    for arm, runs in results.items():
        drawn[arm] = []
        for r in runs:
            c = dict(r["curves"])
            after = [v for v in c["val"] if v[0] > 0]
            c["val"] = after if before is None else [(0.0, before), *after]
            drawn[arm].append({"curves": c})
    if any(drawn.values()):
        plot(drawn, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seeds", type=int, nargs="*", help="default: the harness's (3 splitting, 12 compacting)"
    )
    parser.add_argument(
        "--arms", nargs="*", choices=list(ARMS), help="default: the harness's (mixed: splitting)"
    )
    parser.add_argument("--steps", type=int, default=4, help="training steps (updates) per run")
    parser.add_argument("--batch-groups", type=int, default=3, help="groups of 4 rollouts per step")
    parser.add_argument(
        "--val-tasks", type=int, default=40, help="held-out tasks validated on (of 40)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "ablation")
    parser.add_argument("--model", default="smollm2", help="the engine's model (examples/demo.py)")
    parser.add_argument(
        "--harness", default="splitting", choices=list(HARNESSES), help="the agent trained"
    )
    parser.add_argument(
        "--pilot", action="store_true", help="untrained rollouts only: samples vs reward"
    )
    parser.add_argument("--pilot-groups", type=int, default=12, help="tasks (x 4 rollouts)")
    parser.add_argument("--pilot-out", type=Path, default=FIGURES / "ablation2_pilot.json")
    parser.add_argument(
        "--results",
        type=Path,
        help="compacting: one JSON per finished (arm, seed), kept across sessions "
        "(default bench/figures/ablation2/HARNESS; --quick: under --out)",
    )
    parser.add_argument(
        "--power", type=Path, help="compacting: also write the power analysis to this JSON file"
    )
    parser.add_argument(
        "--report", action="store_true", help="compacting: train nothing, report on the recorded"
    )
    args = parse_args(
        parser,
        seeds=[0],
        arms=["rollout", "sample"],
        steps=1,
        batch_groups=1,
        val_tasks=4,
        model="tiny",
    )
    harness = HARNESSES[args.harness]
    if args.seeds is None:
        args.seeds = list(range(harness.seeds))
    if args.arms is None:
        args.arms = list(harness.arms)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    val_path = ROOT / "examples" / "calculator" / "val.jsonl"
    val = val_path.read_text().splitlines()[: args.val_tasks]
    (args.out / "val.jsonl").write_text("\n".join(val) + "\n")
    if args.pilot:
        return pilot(args)
    if args.harness == "splitting":
        return side_by_side(args)
    if args.results is None and args.quick:
        args.results = args.out / args.harness
    if args.results is None:
        args.results = FIGURES / "ablation2" / args.harness
    if args.report:
        return report(args)
    return experiment(args)


def side_by_side(args: argparse.Namespace) -> int:
    """The splitting experiment: every arm and seed trained in this one session, then the table."""
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
