"""The statistics of the ablation's reports: means and spreads, correlation, Welch's interval, power.

- `mean_or_nan`, `sd_or_nan`: NaN where there are too few values, not an error.
- `correlation` (Pearson), `rank_correlation` (Spearman): NaN when a side is constant.
- `welch`: the difference of two arms' means with Welch's t confidence interval.
- `seeds_for_power`, `power_analysis`: the seeds per arm that a seed-to-seed spread asks for.
- Not here: reading runs or printing (bench/ablation/compacting.py, bench/ablation/splitting.py).
"""

from __future__ import annotations

import math
import statistics

import scipy.stats


def mean_or_nan(values: list[float]) -> float:
    """The mean; NaN for none (a run whose every group scored alike trains nothing)."""
    if not values:
        return float("nan")
    return statistics.mean(values)


def sd_or_nan(values: list[float]) -> float:
    """The sample standard deviation; NaN for fewer than two values."""
    if len(values) < 2:
        return float("nan")
    return statistics.stdev(values)


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


def power_analysis(finals: dict[str, list[float]], delta: float, planned: int) -> dict:
    """Seeds per arm for 80% power at a difference `delta` (two-sided, 5%), from the pooled
    seed-to-seed sd of the final validation reward in the runs so far, and from that sd's 90% upper
    confidence bound (chi-square): a few seeds estimate an sd loosely, and planning on the point
    estimate would too often leave the experiment short. `planned`: the seeds per arm the
    experiment runs by default, reported beside."""
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
        "seeds_planned": planned,
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
