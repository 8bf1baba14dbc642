"""examples/reward_curve.py draws a run's curves from the metrics.jsonl that `agl train` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_s_metrics_become_a_png(tmp_path: Path) -> None:
    steps = [
        {"reward/mean": 0.2 * i, "actor/entropy": 1.0 - 0.1 * i, "rollout/sampled_entropy": 0.9}
        for i in range(3)
    ]
    val = [{"val/step": 0.0, "val/reward_mean": 0.5}, {"val/step": 3.0, "val/reward_mean": 0.75}]
    history = [val[0], *steps, val[1]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    script = ROOT / "examples" / "reward_curve.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], check=True)
    assert done.returncode == 0 and (tmp_path / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
