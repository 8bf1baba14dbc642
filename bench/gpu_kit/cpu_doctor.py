"""`agl doctor` on the CPU path from the bundle: Ray and verl's workers run, not only import.

Usage: python -m bench.gpu_kit.cpu_doctor MODEL_DIR WORK_DIR   (check_venv.sh runs it)

In the CPU stand-in of the GPU machine, with the kit's env.sh sourced: it serves the tests'
scripted sglang stand-in (tests/sglang.py, which imports pytest) for MODEL_DIR on 127.0.0.1 and
runs `agl doctor --skip-versions` on examples/calculator/train.yaml (`trainer.device: cpu`)
against it. That starts Ray and verl's FSDP worker group with the tiny Qwen3 from the bundle's
wheels, generates, streams, and pushes the weights through the trainer's own path (sleep, push,
wake). Last line:
`gpu_bundle_cpu_doctor=RC` (0: every check passed or was skipped). sglang itself, CUDA and the
collocated push in GPU memory are the GPU machine's to check (run.sh).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from tests.sglang import SglangStandIn
from trainer import doctor

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "train.yaml"


def main(model: Path, work: Path) -> int:
    logging.basicConfig(level=logging.INFO)
    sglang = SglangStandIn(model, ["Hello there, friend."], context_len=2048, token_delay_s=0.002)
    with sglang.served() as url:
        overrides = [
            "agl.admin_key=k",
            f"agl.engine={url}",
            "agl.threads=1",
            f"trainer.default_local_dir={work}",
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.max_model_len=2048",
        ]
        code = doctor.main(["--skip-versions", str(CONFIG), *overrides])
    print(f"gpu_bundle_cpu_doctor={code}")
    return code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
