"""`make demo-check`: the demo, five times (seeds 0-4), two of them beside a busy core.

- Each run is `examples/demo.py --seed N` from scratch (fresh store, no checkpoint), as a user
  would run it, through bench/stack.py; seeds 1 and 3 run while another process keeps one core
  busy for the whole run, as on a shared machine.
- Per run: greedy validation reward on the held-out tasks before training and at the end, the
  first-3 and last-3 steps' training reward, and wall time.
- Pass: every run's final validation reward is at least its initial one plus 0.15, and no run's
  last-3 training mean is below its first-3. Exits 1 otherwise.
- Last line: `demo_runs=5 improved=K collapsed=C val_before_mean=A val_after_mean=B max_wall_s=W`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from bench.quick import parse_args
from bench.stack import ROOT, busy_core, run_logged

MARGIN = 0.15


def run(seed: int, out: Path, loaded: bool, args: argparse.Namespace) -> dict[str, float]:
    demo = [sys.executable, str(ROOT / "examples" / "demo.py")]
    demo += ["--seed", str(seed), "--out", str(out), "--model", args.model]
    if args.steps:
        demo += [f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.steps}"]
    with contextlib.ExitStack() as beside:
        if loaded:
            beside.enter_context(busy_core())
        code = run_logged(demo, out.parent / f"seed{seed}.log")
    if code != 0:
        raise SystemExit(
            f"seed {seed}: the demo exited with {code}; see {out.parent / f'seed{seed}.log'}"
        )
    return dict(json.loads((out / "summary.json").read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--loaded", type=int, nargs="*", default=[1, 3], help="seeds run beside a busy core"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo_runs")
    parser.add_argument("--model", default="smollm2", help="the engine's model (examples/demo.py)")
    parser.add_argument("--steps", type=int, help="training steps per run (default: train.yaml's)")
    args = parse_args(parser, seeds=[0], loaded=[], model="tiny", steps=3)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    print(
        "| seed | machine | validation before | validation after | train first 3 | train last 3 | wall |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for seed in args.seeds:
        loaded = seed in args.loaded
        r = run(seed, args.out / f"seed{seed}", loaded, args) | {"seed": seed, "loaded": loaded}
        results.append(r)
        machine = "one core busy" if loaded else "quiet"
        print(
            f"| {seed} | {machine} | {r['val_before']:.3f} | {r['val_after']:.3f} "
            f"| {r['train_first3']:.3f} | {r['train_last3']:.3f} | {r['wall_s']:.0f} s |",
            flush=True,
        )
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    improved = sum(r["val_after"] >= r["val_before"] + MARGIN for r in results)
    collapsed = sum(r["train_last3"] < r["train_first3"] for r in results)
    n = len(results)
    ok = improved == n and collapsed == 0
    if args.quick:
        # Three steps of the tiny random model run the demo through; they cannot show learning.
        print("quick run: not judged")
    elif ok:
        print("PASS")
    else:
        print(f"FAIL: {n - improved} run(s) improved by less than {MARGIN}, {collapsed} collapsed")
    print(
        f"demo_runs={n} improved={improved} collapsed={collapsed} "
        f"val_before_mean={sum(r['val_before'] for r in results) / n:.3f} "
        f"val_after_mean={sum(r['val_after'] for r in results) / n:.3f} "
        f"max_wall_s={max(r['wall_s'] for r in results):.0f}"
    )
    return 0 if ok or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
