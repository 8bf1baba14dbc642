"""Rollout-level against sample-level handling, trained side by side on a harness whose rollouts split.

- `python -m bench.ablation`: the splitting experiment (bench/ablation/splitting.py);
  `--harness compacting` or `compacting-subagent`: the compacting one (bench/ablation/compacting.py);
  `--pilot`: the untrained model's samples against reward on the harness (bench/ablation/pilot.py).
- Every run from scratch through examples/demo.py, validated on the first `--val-tasks` of the
  calculator's held-out tasks; `--report`: a report on the recorded runs alone, training nothing.
- `--quick`: one seed, one step of the tiny model, its results under `--out`.
- Each experiment's module docstring gives its last line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

from bench.ablation import compacting, pilot, splitting
from bench.ablation.training import ARMS, EXAMPLES, FIGURES, HARNESSES
from bench.quick import parse_args
from bench.stack import ROOT


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seeds", type=int, nargs="*", help="default: the harness's (3 splitting, 15 compacting)"
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
    parser.add_argument("--pilot-out", type=Path, default=pilot.PILOT_FIGURES)
    parser.add_argument(
        "--results",
        type=Path,
        help="one JSON per finished (arm, seed) (default: splitting --out/splitting; compacting "
        "bench/figures/ablation2/HARNESS, kept across sessions; --quick: under --out)",
    )
    parser.add_argument(
        "--power", type=Path, help="compacting: also write the power analysis to this JSON file"
    )
    parser.add_argument(
        "--report", action="store_true", help="train nothing, report on the recorded runs"
    )
    return parse_args(
        parser,
        seeds=[0],
        arms=["rollout", "sample"],
        steps=1,
        batch_groups=1,
        val_tasks=4,
        model="tiny",
    )


def main() -> int:
    args = parse()
    harness = HARNESSES[args.harness]
    if args.seeds is None:
        args.seeds = list(range(harness.seeds))
    if args.arms is None:
        args.arms = list(harness.arms)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    val = (EXAMPLES / "calculator" / "val.jsonl").read_text().splitlines()[: args.val_tasks]
    (args.out / "val.jsonl").write_text("\n".join(val) + "\n")
    if args.results is None:
        args.results = args.out / args.harness
        if args.harness != "splitting" and not args.quick:
            args.results = FIGURES / "ablation2" / args.harness
    if args.pilot:
        return pilot.main(args)
    experiment: ModuleType = compacting  # the compacting harnesses' module
    if args.harness == "splitting":
        experiment = splitting
    if args.report:
        return experiment.report(args)
    return experiment.main(args)


if __name__ == "__main__":
    sys.exit(main())
