"""Every benchmark still runs: `python -m bench.NAME --quick` as a subprocess, its last line's names.

- A benchmark nothing runs rots; each one's quick mode (bench/quick.py) runs it through, smaller.
- This test runs it and checks that it exits 0 and that its last line is `key=value` pairs with
  exactly the names bench/README.md gives (scripts and the README's table read them by name).
- The figures of a quick run are not judged: a timed assertion here would fail on a busy machine,
  and the quick runs are too small to mean anything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAST_LINE = {
    "store": ["store_calls_per_s", "baseline_ratio"],
    "adapter": [
        "adapter_mtok_per_s",
        "split_weight_ratio_sample_level",
        "split_weight_ratio_rollout_level",
    ],
    "engine": ["engine_tok_per_s_1", "engine_tok_per_s_8", "batching_speedup"],
    "gateway": ["gateway_p50_overhead_ms", "gateway_calls_per_s", "gateway_rss_mb"],
    "gateway_ab": [
        "ab_p50_overhead_ms_this",
        "ab_p50_overhead_ms_other",
        "ab_calls_per_s_this",
        "ab_calls_per_s_other",
        "ab_cpu_ms_c1_this",
        "ab_cpu_ms_c1_other",
        "ab_cpu_ms_c64_this",
        "ab_cpu_ms_c64_other",
    ],
    "gateway_long": ["gateway_p50_ms_20", "gateway_p50_ms_200", "gateway_bytes_per_call_200"],
    "streaming": ["ttft_ms_direct", "ttft_ms_gateway", "total_ms_gateway", "stream_cpu_ratio"],
    "controller": ["controller_launch_per_s", "controller_rss_mb_500"],
    "replicas": [
        "replicas_1_calls_per_s",
        "replicas_2_calls_per_s",
        "replica_kill_lost",
        "replica_kill_duplicated",
        "pause_drained_all",
        "replicas_1_cpu_ms",
        "replicas_2_cpu_ms",
        "replicas_2_sticky_cpu_ms",
        "replicas_2_cpu_ratio",
    ],
    "hostile": ["hostile_attacks", "defects", "max_stall_ms", "rss_growth_mb"],
    "soak": [
        "soak_calls",
        "lost",
        "errors_seen_by_harness",
        "duplicated",
        "orphaned_at_kill",
        "gateway_kills",
        "gateway_peak_rss_mb",
        "load_calls_per_s",
        "pause_cycles",
        "calls_across_versions",
        "cross_rollout_attempts",
        "cross_rollout_accepted",
        "engine_fault_503s",
        "engine_5xx_retried_ok",
        "healthz_failures",
        "controller_kills",
        "launched_twice",
        "wrong_outcomes",
        "children_left",
        "gateway_restart_runs_retried",
        "controller_peak_rss_mb",
        "soak_s",
    ],
    "async_vs_sync": ["async_vs_sync_speedup", "max_staleness_seen"],
    "demo_runs": [
        "demo_runs",
        "improved",
        "collapsed",
        "val_before_mean",
        "val_after_mean",
        "max_wall_s",
    ],
    "ablation": [
        "ablation_val_rollout",
        "ablation_val_sample",
        "ablation_val_mixed",
        "ablation_entropy_ratio_rollout",
        "ablation_entropy_ratio_sample",
        "seeds",
        "samples_per_rollout",
    ],
}
# `bench.ablation --harness compacting`'s
ABLATION2 = [
    "ablation2_val_rollout",
    "ablation2_val_sample",
    "ablation2_diff_ci_low",
    "ablation2_diff_ci_high",
    "ablation2_entropy_ratio_rollout",
    "ablation2_entropy_ratio_sample",
    "seeds",
    "samples_per_rollout_mean",
    "samples_reward_corr",
]
# A number, or a fraction such as soak's `engine_fault_503s=4/4`; `nan` for an arm not run.
VALUE = re.compile(r"-?(\d+(\.\d+)?(/\d+)?|nan)")


def test_every_benchmark_is_listed() -> None:
    """A new benchmark gets a quick run here, and a row in bench/README.md."""
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")}
    modules |= {p.parent.name for p in (ROOT / "bench").glob("*/__main__.py")}  # bench/ablation/
    helpers = {"__init__", "quick", "postgres", "stack"}
    assert modules - helpers == set(LAST_LINE)
    table = (ROOT / "bench" / "README.md").read_text()
    for name in LAST_LINE:
        assert f"`bench.{name}" in table, f"bench/README.md has no row for bench.{name}"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the ones that train: a few minutes on two busy cores
@pytest.mark.parametrize("name", list(LAST_LINE))
def test_quick_run(name: str, tmp_path: Path) -> None:
    if name == "replicas" and not os.environ.get("AGL_TEST_POSTGRES_URL"):
        pytest.skip("bench.replicas needs PostgreSQL: AGL_TEST_POSTGRES_URL is not set")
    options = []
    if name in ("demo_runs", "ablation"):
        options = ["--out", str(tmp_path / name)]
    check_quick_run(name, options, LAST_LINE[name])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_quick_run_of_the_compacting_ablation(tmp_path: Path) -> None:
    """bench.ablation's second experiment, on the compacting agent: a last line of its own."""
    options = ["--harness", "compacting", "--out", str(tmp_path / "ablation2")]
    check_quick_run("ablation", options, ABLATION2)


def check_quick_run(name: str, options: list[str], keys: list[str]) -> None:
    """`python -m bench.NAME --quick OPTIONS` exits 0 and its last line has exactly `keys`."""
    argv = [sys.executable, "-m", f"bench.{name}", "--quick", *options]
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"bench.{name} --quick exited {done.returncode}:\n{output[-4000:]}"
    last = done.stdout.strip().splitlines()[-1]
    pairs = [field.split("=", 1) for field in last.split()]
    assert [key for key, _ in pairs] == keys, last
    for key, value in pairs:
        assert VALUE.fullmatch(value), f"{key}={value} is not a figure"
