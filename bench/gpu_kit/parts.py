"""Split a file into parts of at most a given size, and join them back, checked by SHA-256.

Usage:
    python -m bench.gpu_kit.parts split FILE DIR [--limit-mib 60]   # DIR/FILE.part00 ... + SHA256SUMS
    python -m bench.gpu_kit.parts join DIR OUT                      # the parts, checked, joined to OUT

The GPU machine takes files in parts of at most 60 MiB, one part a call, so the bundle travels
as parts. `split` writes `NAME.partNN` (NN from 00) and a manifest, `SHA256SUMS`, in the format of
`sha256sum`: one line per part and a last one for the whole file. `join` checks every part and
the joined file against it and refuses a missing, extra or changed part. It uses the standard
library only (the GPU machine has no network to fetch anything else) and compresses nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path

MANIFEST = "SHA256SUMS"
CHUNK = 1 << 20


class PartsError(Exception):
    """The parts do not make the file the manifest names: which part, and what is wrong."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(path: Path, out: Path, limit: int) -> list[Path]:
    """Write `path` as parts of at most `limit` bytes into `out`, as few as that takes and of
    about equal size (each then leaves the call room for the working tree that travels with it),
    and their manifest; remove the parts a previous split of the same name left there."""
    if limit < 1:
        raise ValueError(f"a part must hold at least one byte, not {limit}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{path.name}.part*"):
        old.unlink()
    total = path.stat().st_size
    count = max(1, math.ceil(total / limit))
    size = max(1, math.ceil(total / count))
    parts: list[Path] = []
    with path.open("rb") as f:
        while block := f.read(size):
            part = out / f"{path.name}.part{len(parts):02d}"
            part.write_bytes(block)
            parts.append(part)
    lines = [f"{sha256(part)}  {part.name}" for part in parts]
    lines.append(f"{sha256(path)}  {path.name}")
    (out / MANIFEST).write_text("\n".join(lines) + "\n")
    return parts


def join(folder: Path, out: Path) -> Path:
    """Check the parts in `folder` against its manifest and join them into `out`."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise PartsError(f"no {MANIFEST} in {folder}: carry it with the parts")
    entries = [line.split("  ", 1) for line in manifest.read_text().splitlines() if line]
    *parts, (whole_digest, whole_name) = entries
    extra = {p.name for p in folder.glob(f"{whole_name}.part*")} - {name for _, name in parts}
    if extra:
        raise PartsError(f"parts the manifest does not name: {sorted(extra)}")
    for digest, name in parts:
        if not (folder / name).is_file():
            raise PartsError(f"{name} is missing: {len(parts)} parts make {whole_name}")
        if sha256(folder / name) != digest:
            raise PartsError(f"{name} differs from the one split (SHA-256): carry it again")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        for _, name in parts:
            with (folder / name).open("rb") as part:
                while block := part.read(CHUNK):
                    f.write(block)
    if sha256(out) != whole_digest:
        raise PartsError(f"the joined {out} differs from {whole_name} as split")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    split_args = commands.add_parser("split", help="FILE into parts in DIR")
    split_args.add_argument("file", type=Path)
    split_args.add_argument("dir", type=Path)
    split_args.add_argument("--limit-mib", type=float, default=60, help="largest part, MiB")
    join_args = commands.add_parser("join", help="the parts in DIR into OUT")
    join_args.add_argument("dir", type=Path)
    join_args.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "split":
        for part in split(args.file, args.dir, int(args.limit_mib * 2**20)):
            print(f"{part}  {part.stat().st_size / 2**20:.1f} MiB")
        return 0
    try:
        print(join(args.dir, args.out))
    except PartsError as e:
        print(f"parts: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
