"""Which distributions a set of entry modules imports, read from source without running it.

Usage: python -m bench.gpu_kit.import_closure SITE [--src DIR ...] ENTRY [ENTRY ...]

SITE is a folder of unpacked wheels (each wheel's files and its `*.dist-info`); `--src` adds
folders of plain source (agl's own packages). From each entry module it follows the imports
written at module level, in class bodies and under `try`/`if`, into every module found in SITE or
a `--src` folder (a module's parent packages count as imported too). An import under `try` or
`if` is *guarded*: the code has a fallback or a condition, so a missing module there may be fine.

It prints the distributions in SITE whose modules are reached by unguarded imports (these go into
wheels.txt), those reached only by guarded ones, and the top-level names found nowhere (neither
in SITE, the `--src` folders nor the standard library), each with a module that imports it.

It does not run any code, so it misses imports made inside functions and by name
(`importlib.import_module`): verl's rollout and engine registries, for one. List such modules
as entries yourself, and let check.py's real imports have the last word.
"""

from __future__ import annotations

import argparse
import ast
import csv
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Closure:
    """What a walk found: modules read, reached top-level names (hard or guarded only)."""

    read: set[str] = field(default_factory=set)
    hard: dict[str, str] = field(default_factory=dict)  # top-level name -> a module importing it
    guarded: dict[str, str] = field(default_factory=dict)


def module_file(roots: list[Path], module: str) -> Path | None:
    """The source file of `module` under one of `roots`, or None."""
    relative = Path(*module.split("."))
    for root in roots:
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The module names an import statement may load (for `from m import x`, `m` and `m.x`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if not is_package:
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def imports(
    body: list[ast.stmt], guarded: bool
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import statement run when the module loads, and whether a try or an if guards it."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, guarded
        elif isinstance(node, ast.Try):
            yield from imports(node.body, True)
            for handler in node.handlers:  # the fallback: runs only when the body failed
                yield from imports(handler.body, True)
            yield from imports(node.orelse, guarded)
            yield from imports(node.finalbody, guarded)
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from imports(node.body, True)
                yield from imports(node.orelse, True)
        elif isinstance(node, ast.With):  # `with suppress(ImportError):` guards what it holds
            yield from imports(node.body, guarded or "suppress" in ast.unparse(node.items[0]))
        elif isinstance(node, ast.ClassDef):
            yield from imports(node.body, guarded)


def walk(roots: list[Path], entries: list[str]) -> Closure:
    found = Closure()
    stack = [(entry, False, entry) for entry in entries]  # (module, guarded, imported by)
    done: set[tuple[str, bool]] = set()
    while stack:
        module, guarded, importer = stack.pop()
        if (module, guarded) in done or (module, False) in done:
            continue
        done.add((module, guarded))
        top = module.split(".")[0]
        reached = found.guarded if guarded else found.hard
        reached.setdefault(top, importer)
        path = module_file(roots, module)
        if path is None:
            continue
        found.read.add(module)
        parts = module.split(".")
        stack += [(".".join(parts[:i]), guarded, importer) for i in range(1, len(parts))]
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError as e:
            print(f"cannot parse {path}: {e}", file=sys.stderr)
            continue
        is_package = path.name == "__init__.py"
        for node, node_guarded in imports(tree.body, guarded):
            for name in imported_names(node, module, is_package):
                if module_file(roots, name) is not None or "." not in name:
                    stack.append((name, node_guarded, module))
                else:  # `from m import attribute`: m itself is on the stack already
                    (found.guarded if node_guarded else found.hard).setdefault(
                        name.split(".")[0], module
                    )
    return found


def distributions(site: Path) -> dict[str, str]:
    """Top-level name -> 'distribution==version' for each wheel unpacked in `site`."""
    owner: dict[str, str] = {}
    for info in sorted(site.glob("*.dist-info")):
        name, version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        record = info / "RECORD"
        if not record.is_file():
            continue
        for row in csv.reader(record.read_text().splitlines()):
            first = row[0].split("/")[0]
            top = first.removesuffix(".py").split(".")[0]
            if top and not first.endswith((".dist-info", ".data")):
                owner.setdefault(top, f"{name}=={version}")
    return owner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path)
    parser.add_argument("--src", type=Path, action="append", default=[])
    parser.add_argument("entries", nargs="+")
    args = parser.parse_args(argv)
    found = walk([args.site, *args.src], args.entries)
    owner = distributions(args.site)
    local = {p.name for src in args.src for p in src.iterdir()}
    local |= {p.stem for src in args.src for p in src.glob("*.py")}
    std = set(sys.stdlib_module_names)

    def report(title: str, names: dict[str, str], skip: set[str]) -> None:
        dists = sorted({owner[n] for n in names if n in owner} - skip)
        print(f"{title} ({len(dists)}):")
        for dist in dists:
            print("  " + dist)

    report("distributions imported unguarded", found.hard, set())
    hard_dists = {owner[n] for n in found.hard if n in owner}
    report("distributions imported only under try/if", found.guarded, hard_dists)
    for title, names in (("missing, unguarded", found.hard), ("missing, guarded", found.guarded)):
        missing = sorted(n for n in names if n not in owner and n not in local and n not in std)
        if title == "missing, guarded":
            missing = [n for n in missing if n not in found.hard]
        print(f"{title} ({len(missing)}):")
        for name in missing:
            print(f"  {name} (from {names[name]})")
    print(f"modules_read={len(found.read)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
