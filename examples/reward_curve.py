"""`python examples/reward_curve.py RUN_DIR`: a training run's curves as a PNG, from its `metrics.jsonl`.

`agl train` writes one JSON object per step and per validation round to
`trainer.default_local_dir/metrics.jsonl` (and the same to TensorBoard or W&B, per `trainer.logger`).
This draws training and validation reward per step and, below them, the policy's entropy, into
`RUN_DIR/reward_curve.png`; `examples/demo.py` draws it at the end of every demo.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(run: Path) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure to close

    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [h for h in history if "reward/mean" in h]

    def series(key: str) -> tuple[list[float], list[float]]:
        xs = [float(i) for i, h in enumerate(steps, 1) if key in h]
        return xs, [h[key] for h in steps if key in h]

    val = [(h["val/step"], h["val/reward_mean"]) for h in history if "val/reward_mean" in h]
    fig = Figure(figsize=(6, 5.5), layout="tight")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(*series("reward/mean"), marker="o", label="train reward (mean)")
    if val:
        top.plot(*zip(*val, strict=True), marker="s", label="validation reward (mean)")
    top.set_ylabel("reward")
    bottom.plot(*series("rollout/sampled_entropy"), marker=".", label="sampled tokens (-logprob)")
    bottom.plot(*series("actor/entropy"), marker=".", label="policy (full distribution)")
    bottom.set_ylabel("entropy (nats/token)")
    bottom.set_xlabel("step")
    for ax in (top, bottom):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.savefig(run / "reward_curve.png", dpi=100)
    return run / "reward_curve.png"


if __name__ == "__main__":
    print(plot(Path(sys.argv[1])))
