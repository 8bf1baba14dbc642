"""tools/loc.py (`make loc`): every optional feature names modules that exist, and the split adds up.

The tool runs as `make loc` runs it, a subprocess; its figures are read from its last line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_loc(*flags: str) -> str:
    argv = [sys.executable, str(ROOT / "tools" / "loc.py"), *flags]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def test_core_and_optional_add_up_to_the_control_plane() -> None:
    out = run_loc()
    figures = dict(pair.split("=") for pair in out.strip().splitlines()[-1].split())
    assert list(figures) == ["control_plane_loc", "core_loc", "optional_loc", "engine_loc"]
    total, core, optional = (
        int(figures[k]) for k in ("control_plane_loc", "core_loc", "optional_loc")
    )
    assert core > 0 and optional > 0
    assert core + optional == total
    components = out.splitlines()[:5]
    assert sum(int(line.split()[-1]) for line in components) == total


def feature_modules() -> list[str]:
    """The modules `--markdown` names in its features' rows, in order."""
    rows = [line for line in run_loc("--markdown").splitlines() if line.startswith("| ")][2:]
    cells = [row.split("|")[3].replace("`", "") for row in rows]
    return [name.strip() for cell in cells for name in cell.split(",")]


def test_each_features_modules_exist_once() -> None:
    """A module renamed or moved fails here (the tool refuses), not silently as core."""
    modules = feature_modules()
    assert len(modules) == len(set(modules))
    for name in modules:
        assert (ROOT / name).is_file(), name


def reading_rows() -> list[str]:
    lines = run_loc("--reading").splitlines()
    return [line.split("|")[1].strip().strip("`") for line in lines if line.startswith("| `")]


def test_every_core_module_is_on_the_reading_path_once() -> None:
    """A new core module joins the path (or a feature); an optional one is not on it."""
    path = reading_rows()
    assert len(path) == len(set(path))
    optional = set(feature_modules())
    core = set()
    for component in ["agl", "gateway", "controller", "trainer", "adapters"]:
        for module in (ROOT / component).rglob("*.py"):
            name = str(module.relative_to(ROOT))
            if module.name != "__init__.py" and "migrations" not in module.parts:
                core.add(name)
    assert set(path) == core - optional


def test_docs_give_the_reading_path_in_the_tools_order() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Reading the code")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [row.split("|")[1].strip().strip("`") for row in rows]
    assert documented == reading_rows()
