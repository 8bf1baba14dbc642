"""The compacting experiment: two arms on an agent whose splits follow failure, resumable by seed.

- The agent (`--harness compacting`): examples/compacting/harness.py, one conversation compacted
  past a prompt length, so a long attempt splits into more samples than a quick one;
  `compacting-subagent` is the same with its summaries delegated to a sub-agent of another name.
- The arms `rollout` and `sample` (bench/ablation/training.py), `COMPACTING_SEEDS` each by default
  (the power analysis on the spread of the first 8: bench/figures/ablation2/power_at_8_seeds.json).
- Resumable: each finished run is recorded at once in `--results` (default
  bench/figures/ablation2/HARNESS/, kept in the repository; `--quick`: under `--out`), and a rerun
  trains only the runs not recorded there; a run killed midway leaves no record.
- Then a report on every recorded run of `--seeds` x `--arms` (`--report`: this alone, training
  nothing): final validation reward per arm (mean, sd), the rollout - sample difference with its
  95% confidence interval (Welch's t), entropy at the last update over the first, samples per
  rollout and their Pearson correlation with reward over the runs' training rollouts (the pilot's
  rollouts where no run recorded any), and the seeds per arm that the spread so far asks for (80%
  power at a 0.05 difference, two-sided 5%). Written to `--results`.json and .png too, and the
  power analysis to `--power` if given.
- Last line: `ablation2_val_rollout=A ablation2_val_sample=B ablation2_diff_ci_low=L
  ablation2_diff_ci_high=H ablation2_entropy_ratio_rollout=E1 ablation2_entropy_ratio_sample=E2
  seeds=N samples_per_rollout_mean=M samples_reward_corr=C` (N: the fewest seeds recorded for an
  arm; nan where a figure needs more seeds).
"""

from __future__ import annotations

import argparse
import json
import math

from bench.ablation import pilot
from bench.ablation.record import Run, entropy_ratio, plot, recorded, settings_of, val_before
from bench.ablation.stats import (
    correlation,
    mean_or_nan,
    power_analysis,
    rank_correlation,
    sd_or_nan,
    welch,
)
from bench.ablation.training import COMPACTING_SEEDS, train_missing


def main(args: argparse.Namespace) -> int:
    """Train the runs not yet recorded, then report on all recorded."""
    train_missing(args)
    return report(args)


def samples_and_rewards(results: dict[str, list[Run]], harness: str) -> tuple[list, list, str]:
    """Every recorded run's training rollouts as (samples, reward) lists and where they came from;
    the untrained pilot's rollouts when no run recorded any."""
    pairs = [pair for runs in results.values() for r in runs for pair in r.rollouts]
    source = "the runs' training rollouts"
    if not pairs:
        figures = json.loads(pilot.PILOT_FIGURES.read_text()).get(harness, {})
        per_rollout = figures.get("per_rollout", [])
        pairs = [p for p in per_rollout if p["status"] == "succeeded" and p["reward"] is not None]
        source = f"the untrained pilot ({pilot.PILOT_FIGURES.name})"
    samples = [float(p["samples"]) for p in pairs]
    rewards = [float(p["reward"]) for p in pairs]
    return samples, rewards, source


def arm_table(results: dict[str, list[Run]]) -> dict[str, dict]:
    """Per arm: its seeds, final validation reward (mean, sd), policy entropy at the first and last
    update (means) and their ratio (mean over runs), samples per rollout; printed as a table."""
    arms = {}
    print(
        "| arm | seeds | final validation (mean, sd) | entropy first -> last | end/start "
        "| samples per rollout |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for arm, runs in results.items():
        finals = [r.val_final for r in runs]
        ratios = [entropy_ratio(r.curves["entropy"]) for r in runs]
        a = {
            "seeds": [r.seed for r in runs],
            "val_final": finals,
            "val_mean": mean_or_nan(finals),
            "val_sd": sd_or_nan(finals),
            "entropy_first": mean_or_nan([r.entropy_first for r in runs if r.entropy_first]),
            "entropy_last": mean_or_nan([r.entropy_last for r in runs if r.entropy_last]),
            "entropy_ratio": mean_or_nan([x for x in ratios if math.isfinite(x)]),
            "samples_per_rollout": mean_or_nan([v for r in runs for v in r.samples_per_rollout]),
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
    results = recorded(args)
    before = val_before(results)
    arms = arm_table(results)
    finals = {arm: a["val_final"] for arm, a in arms.items()}
    diff, low, high = welch(finals.get("rollout", []), finals.get("sample", []))
    samples, rewards, source = samples_and_rewards(results, args.harness)
    corr = correlation(samples, rewards)
    power = power_analysis(finals, delta=0.05, planned=COMPACTING_SEEDS)
    spr_all = mean_or_nan(
        [v for runs in results.values() for r in runs for v in r.samples_per_rollout]
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
    plot(results, args.results.with_suffix(".png"))
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
