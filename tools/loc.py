"""Code lines of the control plane: per component, the core path, and each optional feature.

- A code line is neither blank nor a comment (docstrings count), as `tools/readability.py` counts.
- `FEATURES` names the modules of each optional feature: what a reader of the core path can skip.
  Every other module of the control plane is core; docs/architecture.md gives the reading path.
- `python tools/loc.py` (`make loc`) prints the table; its last line is `control_plane_loc=N
  core_loc=N optional_loc=N engine_loc=N`. `--markdown` prints the features as a table.
- Size is reported, never targeted.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ["agl", "gateway", "controller", "trainer", "adapters"]
BLANK_OR_COMMENT = re.compile(r"^\s*(#|$)")

# feature: (what it adds, its modules); each module in one feature only
FEATURES: dict[str, tuple[str, list[str]]] = {
    "streaming": (
        "streamed replies, shown as sampled",
        ["gateway/stream.py"],
    ),
    "wire formats": (
        "Completions, Responses and Anthropic Messages beside Chat Completions",
        ["gateway/wire/completions.py", "gateway/wire/responses.py", "gateway/wire/messages.py"],
    ),
    "replicas": (
        "gateway replicas on one PostgreSQL",
        ["gateway/fleet.py", "agl/migrations/versions/0004_replicas.py"],
    ),
    "Kubernetes": (
        "rollouts as Jobs that report their own end; `agl jobs`",
        [
            "controller/kube.py",
            "controller/manifests.py",
            "controller/jobs.py",
            "controller/report.py",
        ],
    ),
    "doctor": (
        "`agl doctor`: the stack checked before a run",
        [
            "trainer/doctor/__init__.py",
            "trainer/doctor/cli.py",
            "trainer/doctor/checkup.py",
            "trainer/doctor/install.py",
            "trainer/doctor/replies.py",
            "trainer/doctor/probes.py",
            "trainer/doctor/report.py",
        ],
    ),
    "CPU training": (
        "verl's FSDP workers on the CPU",
        ["trainer/cpu_platform.py", "trainer/fsdp_guard.py"],
    ),
}


def code_lines(path: Path) -> int:
    lines = path.read_text().splitlines()
    return sum(1 for line in lines if not BLANK_OR_COMMENT.match(line))


def modules(component: str) -> list[Path]:
    return sorted((ROOT / component).rglob("*.py"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="the features as a table")
    args = parser.parse_args()
    optional = {ROOT / name for _, names in FEATURES.values() for name in names}
    missing = sorted(str(path.relative_to(ROOT)) for path in optional if not path.exists())
    if missing:
        raise SystemExit(f"tools/loc.py: FEATURES names modules that are gone: {missing}")
    if args.markdown:
        print("| feature | what it adds | modules | code lines |")
        print("| --- | --- | --- | ---: |")
        for feature, (adds, names) in FEATURES.items():
            lines = sum(code_lines(ROOT / name) for name in names)
            shown = ", ".join(f"`{name}`" for name in names)
            print(f"| {feature} | {adds} | {shown} | {lines} |")
        return
    total = 0
    core = 0
    for component in COMPONENTS:
        paths = modules(component)
        lines = sum(code_lines(path) for path in paths)
        core += sum(code_lines(path) for path in paths if path not in optional)
        total += lines
        print(f"{component:<11} {lines:>5}")
    for feature, (_, names) in FEATURES.items():
        lines = sum(code_lines(ROOT / name) for name in names)
        print(f"  optional: {feature:<13} {lines:>5}")
    engine = sum(code_lines(path) for path in modules("engine"))
    print(f"engine      {engine:>5}")
    print(
        f"control_plane_loc={total} core_loc={core} optional_loc={total - core} engine_loc={engine}"
    )


if __name__ == "__main__":
    main()
