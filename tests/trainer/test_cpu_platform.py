"""trainer/cpu_platform.py in verl's platform registry: registered on import, chosen only when
asked for.

Each check runs in a subprocess: verl resolves its platform once per process, and the module
registers itself (and, when asked for, patches `torch.Tensor.pin_memory`) for the whole process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json

from verl.plugin.platform.platform_manager import PlatformRegistry, _detect_platform_name

from trainer import cpu_platform

print(json.dumps({
    "registered": "cpu" in PlatformRegistry.registered_names(),
    "detected": _detect_platform_name(),
    "available": cpu_platform.PlatformCPU().is_platform_available(use_smi_check=True),
}))
"""


def detect(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={**clean, "OMP_NUM_THREADS": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_verls_auto_detection_never_falls_back_to_the_cpu() -> None:
    """Without VERL_PLATFORM verl probes its registered platforms and takes the first available
    one: on a machine whose accelerator probe fails it must not be the CPU (verl falls back to
    `nvidia`, and says so)."""
    got = detect()
    assert got["registered"] is True
    assert got["available"] is False
    assert got["detected"] != "cpu"


def test_asked_for_the_cpu_platform_is_chosen_and_available() -> None:
    got = detect(VERL_PLATFORM="cpu")
    assert got == {"registered": True, "detected": "cpu", "available": True}
