"""`make gpu-bundle`: the bundle a GPU machine without network installs agl's GPU path from.

Usage: python -m bench.gpu_kit.build [--cache DIR] [--out DIR] [--limit-mib 60]

Run it with the project's .venv (it needs PyPI, and the tests' Qwen tokenizer). It
1. downloads the wheels of wheels.txt for CPython 3.12 on manylinux x86_64 into the cache
   (`$GPU_KIT_CACHE`, default /tmp/gpukit-cache; about 300 MB) and builds those published as
   source only;
2. drops from sglang-kernel and ray what trim.txt names (their RECORD too);
3. builds agl's own wheel from this working tree (`agl` and its subcommands' entry points);
4. writes the tiny Qwen3 model folder: config.json (2 layers, hidden 256, Qwen3.5's vocabulary of
   248,320) and the tests' Qwen BPE tokenizer with its Qwen3-style chat template; no weights
   (random ones are written on the GPU machine: weights.py);
5. packs these into `bundle.tar.gz` and splits it into parts of at most `--limit-mib` MiB in
   `--out` (default .gpu-bundle/, ignored by git) with their SHA256SUMS.

It prints each part's size and the total. It does not install anything, nor check that the
wheels import (that is check_venv.sh and check.py: `make gpu-bundle-check`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from bench.gpu_kit.parts import split

KIT = Path(__file__).resolve().parent
ROOT = KIT.parents[1]

# CPython 3.12 on manylinux x86_64, as pip download takes it (the GPU machine's Python).
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
PLATFORM += [f"--abi={abi}" for abi in ("cp312", "abi3", "none")]
PLATFORM += [
    f"--platform={tag}"
    for tag in (
        "manylinux_2_34_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "any",
    )
]
# Published as a source distribution only (pure Python): built into a wheel here.
SOURCE_ONLY = {"antlr4-python3-runtime"}
TINY_QWEN3 = {  # the model the GPU run trains: Qwen3's architecture, as small as it stays real
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 248320,  # Qwen3.5's vocabulary, which the tests' tokenizer (248,053) fits in
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 40960,  # as Qwen3's
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a pinned list (comments and blank lines skipped), by name."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            found[canonical(name)] = version
    return found


def trims(path: Path) -> dict[str, list[str]]:
    """trim.txt: for each wheel's name, the paths (folders end in /) dropped from it."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, inner = line.split()[:2]
            found.setdefault(canonical(name), []).append(inner)
    return found


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-")[0])


def download(wanted: dict[str, str], into: Path) -> list[Path]:
    """Each pinned wheel, from the cache or PyPI (pip skips what is there already)."""
    into.mkdir(parents=True, exist_ok=True)
    binary = [f"{n}=={v}" for n, v in sorted(wanted.items()) if n not in SOURCE_ONLY]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(into), *binary], check=True
    )
    for name in sorted(SOURCE_ONLY & wanted.keys()):
        spec = f"{name}=={wanted[name]}"
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(into), spec], check=True)
    wheels = {}
    for path in into.glob("*.whl"):
        version = path.name.split("-")[1]
        if wanted.get(wheel_name(path)) == version:
            wheels[wheel_name(path)] = path
    missing = sorted(wanted.keys() - wheels.keys())
    if missing:
        raise SystemExit(f"gpu-bundle: no wheel for {missing} in {into}")
    return sorted(wheels.values())


def trim(wheel: Path, drop: list[str], out: Path) -> Path:
    """`wheel` without the files under `drop`, and without their lines in its RECORD."""
    trimmed = out / wheel.name

    def dropped(name: str) -> bool:
        return any(name == d or (d.endswith("/") and name.startswith(d)) for d in drop)

    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if dropped(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if not dropped(r.split(",")[0].strip('"'))).encode()
            dst.writestr(info, data)
    return trimmed


def agl_wheel(out: Path) -> Path:
    """agl's own wheel (for its `agl` entry points; the code runs from the checkout), built from
    a copy of the files that travel to the GPU machine, so the build leaves nothing here."""
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    names = subprocess.run(listed, cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, names):
            source = ROOT / os.fsdecode(name)
            if source.is_file():
                (Path(tmp) / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, Path(tmp) / os.fsdecode(name))
        command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), tmp]
        subprocess.run(command, check=True)
    return next(out.glob("agl-*.whl"))


def model_folder(out: Path) -> Path:
    """The tiny Qwen3's config and tokenizer (no weights)."""
    from tests.gateway.qwen import CHATML_THINKING, qwen_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = CHATML_THINKING
    tokenizer.save_pretrained(out)
    config = {
        **TINY_QWEN3,
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def build(cache: Path, out: Path, limit: int) -> list[Path]:
    stage = cache / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "wheels").mkdir(parents=True)
    drops = trims(KIT / "trim.txt")
    for wheel in download(pins(KIT / "wheels.txt"), cache / "wheels"):
        if wheel_name(wheel) in drops:
            trim(wheel, drops[wheel_name(wheel)], stage / "wheels")
        else:
            shutil.copy2(wheel, stage / "wheels")
    agl_wheel(stage / "wheels")
    model_folder(stage / "model")
    bundle = cache / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz", compresslevel=6) as tar:
        for item in ("wheels", "model"):
            tar.add(stage / item, arcname=item)
    return split(bundle, out, limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_cache = os.environ.get("GPU_KIT_CACHE", "/tmp/gpukit-cache")
    parser.add_argument("--cache", type=Path, default=Path(default_cache))
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-bundle")
    parser.add_argument("--limit-mib", type=float, default=60, help="largest part, MiB")
    args = parser.parse_args(argv)
    parts = build(args.cache, args.out, int(args.limit_mib * 2**20))
    total = sum(p.stat().st_size for p in parts)
    for part in parts:
        print(f"{part}  {part.stat().st_size / 2**20:.1f} MiB")
    print(f"gpu_bundle_parts={len(parts)} gpu_bundle_mib={total / 2**20:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
