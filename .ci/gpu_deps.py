"""`make gpu-deps`: the `gpu` extra resolves, for Linux x86_64 and Python 3.11, to exactly its pins.

Resolves with uv from package metadata only (no CUDA wheel is downloaded, no GPU is needed), so
an extra that cannot be installed fails here rather than on a user's first GPU node. Usage:
`python .ci/gpu_deps.py` (needs PyPI).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_34"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["gpu"]
    pins = {
        canonical(name): version
        for name, version in (spec.split("==") for spec in extra if "==" in spec)
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gpu.txt"
        command = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--extra", "gpu"]
        command += [*PLATFORM, "--index-url", "https://pypi.org/simple", "-q", "-o", str(out)]
        done = subprocess.run(command, cwd=ROOT)
        if done.returncode != 0:
            print("gpu-deps: the gpu extra does not resolve (uv's message above)")
            return 1
        found = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", out.read_text(), re.M)
        resolved = {canonical(n): v for n, v in found}
    wrong = {
        name: resolved.get(name) for name, version in pins.items() if resolved.get(name) != version
    }
    for name, got in wrong.items():
        print(f"gpu-deps: {name} resolved to {got}, pinned {pins[name]}")
    print(
        f"gpu_deps_resolved={len(resolved)} gpu_deps_pins={len(pins)} gpu_deps_wrong={len(wrong)}"
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
