"""bench/gpu_kit's cheap parts: the pinned lists, splitting and joining, trimming a wheel, and the
import walk, on small files made here. Building the bundle downloads ~300 MB and checking it
needs a Python 3.12 venv (`make gpu-bundle`, `make gpu-bundle-check`): neither runs in tests."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from bench.gpu_kit import build, import_closure
from bench.gpu_kit.parts import MANIFEST, PartsError, join, split

KIT = Path(build.__file__).parent


def test_the_pinned_lists_parse_and_do_not_overlap() -> None:
    carried = build.pins(KIT / "wheels.txt")
    held = build.pins(KIT / "machine.txt")
    assert {"sglang", "sglang-kernel", "verl", "ray", "transformers"} <= carried.keys()
    assert carried["sglang"] == "0.5.13" and carried["verl"] == "0.9.1"
    assert held["torch"] == "2.11.0"
    assert not carried.keys() & held.keys(), "a package both carried and held by the machine"
    assert not {"torch", "triton", "numpy", "flash-attn"} & carried.keys()
    assert build.trims(KIT / "trim.txt").keys() <= carried.keys()


def test_parts_are_even_at_most_the_limit_and_join_back_identically(tmp_path: Path) -> None:
    whole = tmp_path / "bundle.tar.gz"
    data = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes: three parts of <= 4,096, even
    whole.write_bytes(data)
    parts = split(whole, tmp_path / "parts", 4096)
    assert [p.stat().st_size for p in parts] == [3415, 3415, 3414]
    assert join(tmp_path / "parts", tmp_path / "joined").read_bytes() == data


def test_a_second_split_leaves_no_part_of_the_first(tmp_path: Path) -> None:
    whole = tmp_path / "b"
    whole.write_bytes(b"x" * 100)
    split(whole, tmp_path / "parts", 10)
    whole.write_bytes(b"y" * 30)
    assert len(split(whole, tmp_path / "parts", 10)) == 3
    assert join(tmp_path / "parts", tmp_path / "joined").read_bytes() == b"y" * 30


def test_join_refuses_a_missing_or_changed_part(tmp_path: Path) -> None:
    whole = tmp_path / "b"
    whole.write_bytes(b"abc" * 10)
    parts = split(whole, tmp_path / "parts", 8)
    parts[1].write_bytes(b"changed!")
    with pytest.raises(PartsError, match="part01 differs"):
        join(tmp_path / "parts", tmp_path / "joined")
    parts[1].unlink()
    with pytest.raises(PartsError, match="part01 is missing"):
        join(tmp_path / "parts", tmp_path / "joined")
    (tmp_path / "parts" / MANIFEST).unlink()
    with pytest.raises(PartsError, match="no SHA256SUMS"):
        join(tmp_path / "parts", tmp_path / "joined")


def test_trim_drops_the_files_and_their_record_lines(tmp_path: Path) -> None:
    wheel = tmp_path / "in" / "pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    files = {"pkg/__init__.py": "", "pkg/big.so": "x", "pkg/jars/a.jar": "j"}
    record = "".join(f"{name},sha256=0,1\n" for name in files) + "pkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("pkg-1.0.dist-info/RECORD", record)
    (tmp_path / "out").mkdir()
    trimmed = build.trim(wheel, ["pkg/big.so", "pkg/jars/"], tmp_path / "out")
    with zipfile.ZipFile(trimmed) as z:
        assert z.namelist() == ["pkg/__init__.py", "pkg-1.0.dist-info/RECORD"]
        assert z.read("pkg-1.0.dist-info/RECORD").decode().splitlines() == [
            "pkg/__init__.py,sha256=0,1",
            "pkg-1.0.dist-info/RECORD,,",
        ]


def test_the_import_walk_tells_unguarded_from_guarded_imports(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "top").mkdir(parents=True)
    (site / "top" / "__init__.py").write_text(
        "import os\nimport needed\nfrom . import sub\ntry:\n    import optional\nexcept ImportError:\n"
        "    import fallback\n"
    )
    (site / "top" / "sub.py").write_text("import absent\n")
    (site / "needed.py").write_text("")
    for dist, top in (("top", "top"), ("needed", "needed")):
        info = site / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "RECORD").write_text(f"{top}/__init__.py,,\n{top}.py,,\n")
    found = import_closure.walk([site], ["top"])
    owner = import_closure.distributions(site)
    assert {owner[name] for name in found.hard if name in owner} == {"top==1.0", "needed==1.0"}
    assert found.hard["absent"] == "top.sub"
    assert {"optional", "fallback"} <= found.guarded.keys()
    assert "os" in found.hard
