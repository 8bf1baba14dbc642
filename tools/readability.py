#!/usr/bin/env python3
"""How packed the code's lines are, per 1,000 code lines, and whether that stays within the project's limits.

`make lint` runs it over the control plane and the engine. It counts what ruff cannot see: conditional
expressions (`a if c else b`), nested ones and ones holding an `await`, tuple-packed assignments
(`a, b = x, y`), chained assignments (`a = b = x`), default-then-override pairs (below); and beside them
long lines (110 characters or more) and the longest function. A code line is one that is neither blank
nor a comment (docstrings count), as `make loc` counts. Migrations are generated code and are left out.

A symmetric choice of one value is a conditional expression; an exception to a default is an `if`. A
default-then-override pair is the first written as the second:

    kind = "GPU"
    if on_cpu:
        kind = "CPU"            # reads better as: kind = "CPU" if on_cpu else "GPU"

It is counted (`override_per_k`) when all of these hold, and only then:
- `x = A` (one target, annotated or not) is followed, next in the same block, by an `if` with no
  `else` or `elif` whose body is the one statement `x = B`, to the same target;
- A and B are of one kind: both constants (a string, f-string, number or boolean literal, or an
  UPPER_CASE name such as `REASONING` or `Kind.CPU`), or both other names (`left`, `self.limit`).
  A call, an arithmetic expression, a container or `None` is not counted: `count = 1` then
  `count = -(-n // size)`, or `headers = None` then a dict, is a default and its exception;
- the condition mentions neither x nor A: `role = given` then `if role == "developer": role =
  "system"` corrects the value it was given, an exception too.
Its target is none; `make lint` reports the figure without a limit, and `--list` names each pair.

Usage: python tools/readability.py [--list] [DIR ...]   (prints one key=value line; exits 1 past a limit)
It changes nothing and knows nothing of the project beyond the folders it is given.
"""

import ast
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DIRS = ["agl", "gateway", "controller", "trainer", "adapters", "engine"]
LONG_LINE = 110  # characters, indentation included


@dataclass
class Figures:
    """Counts over a tree; `per_k` turns a count into a rate per 1,000 code lines."""

    code_lines: int = 0
    long_lines: int = 0
    conditional_expressions: int = 0
    nested_conditional_expressions: int = 0
    awaits_in_conditional_expressions: int = 0
    packed_assignments: int = 0
    chained_assignments: int = 0
    longest_function: int = 0
    longest_function_at: str = ""
    overrides: list[tuple[str, int]] = field(default_factory=list)  # (path, line) of each pair

    def per_k(self, count: int) -> float:
        return 1000 * count / max(self.code_lines, 1)


@dataclass(frozen=True)
class Limit:
    """One limit: the figure's name as printed, its value and the most it may be."""

    name: str
    value: float
    most: float


def count_lines(text: str, figures: Figures) -> None:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        figures.code_lines += 1
        if len(line) >= LONG_LINE:
            figures.long_lines += 1


def is_packed(node: ast.Assign) -> bool:
    """`a, b = x, y`: a tuple or list of two or more targets given a tuple or list of values."""
    target = node.targets[0]
    sequences = (ast.Tuple, ast.List)
    return (
        isinstance(target, sequences)
        and isinstance(node.value, sequences)
        and len(target.elts) >= 2
    )


def kind(value: ast.expr) -> str:
    """One side of a default-then-override pair: "constant", "name", or "" (neither)."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub | ast.UAdd):
        value = value.operand
    if isinstance(value, ast.JoinedStr):
        return "constant"
    if isinstance(value, ast.Constant):
        return "" if value.value is None else "constant"
    dotted = value
    while isinstance(dotted, ast.Attribute):
        dotted = dotted.value
    if not isinstance(dotted, ast.Name):
        return ""
    last = value.attr if isinstance(value, ast.Attribute) else dotted.id
    return "constant" if last.isupper() else "name"


def is_override(first: ast.stmt, second: ast.stmt) -> bool:
    """`x = A` then `if c: x = B`, which reads better as `x = B if c else A` (module docstring)."""
    if isinstance(first, ast.Assign) and len(first.targets) == 1:
        target, default = first.targets[0], first.value
    elif isinstance(first, ast.AnnAssign) and first.value is not None:
        target, default = first.target, first.value
    else:
        return False
    if not isinstance(second, ast.If) or second.orelse or len(second.body) != 1:
        return False
    override = second.body[0]
    if not isinstance(override, ast.Assign) or len(override.targets) != 1:
        return False
    if ast.unparse(override.targets[0]) != ast.unparse(target):
        return False
    if not kind(default) or kind(default) != kind(override.value):
        return False
    mentioned = {ast.unparse(node) for node in ast.walk(second.test) if isinstance(node, ast.expr)}
    return ast.unparse(target) not in mentioned and ast.unparse(default) not in mentioned


def count_overrides(node: ast.AST, where: str, figures: Figures) -> None:
    """The default-then-override pairs among the statements of one block of `node`."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if not isinstance(block, list):
            continue
        for first, second in itertools.pairwise(block):
            if is_override(first, second):
                figures.overrides.append((where, first.lineno))


def count_nodes(tree: ast.AST, where: str, figures: Figures) -> None:
    for node in ast.walk(tree):
        count_overrides(node, where, figures)
        if isinstance(node, ast.IfExp):
            figures.conditional_expressions += 1
            parts = (node.test, node.body, node.orelse)
            if any(isinstance(part, ast.IfExp) for part in parts):
                figures.nested_conditional_expressions += 1
            if any(isinstance(inner, ast.Await) for inner in ast.walk(node)):
                figures.awaits_in_conditional_expressions += 1
        elif isinstance(node, ast.Assign):
            if len(node.targets) > 1:
                figures.chained_assignments += 1
            if is_packed(node):
                figures.packed_assignments += 1
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > figures.longest_function:
                figures.longest_function = length
                figures.longest_function_at = f"{where}:{node.lineno}:{node.name}"


def measure(dirs: list[str]) -> Figures:
    figures = Figures()
    for folder in dirs:
        for path in sorted(Path(folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            text = path.read_text(errors="ignore")
            count_lines(text, figures)
            count_nodes(ast.parse(text), str(path), figures)
    return figures


def limits(figures: Figures) -> list[Limit]:
    """The project's limits (the readability issue's "done when")."""
    return [
        Limit("long_per_k", figures.per_k(figures.long_lines), 25),
        Limit("ifexp_per_k", figures.per_k(figures.conditional_expressions), 15),
        Limit("packed_per_k", figures.per_k(figures.packed_assignments), 8),
        Limit("nested_ifexp", figures.nested_conditional_expressions, 0),
        Limit("await_in_ifexp", figures.awaits_in_conditional_expressions, 0),
        Limit("chained", figures.chained_assignments, 2),
        Limit("longest_function", figures.longest_function, 60),
    ]


def main(argv: list[str]) -> int:
    dirs = [arg for arg in argv if arg != "--list"]
    figures = measure(dirs or DEFAULT_DIRS)
    checked = limits(figures)
    shown = " ".join(
        f"{limit.name}={limit.value:.1f}" for limit in checked if limit.name.endswith("_per_k")
    )
    shown += f" override_per_k={figures.per_k(len(figures.overrides)):.1f}"  # reported, no limit
    shown += " " + " ".join(
        f"{limit.name}={limit.value:.0f}" for limit in checked if not limit.name.endswith("_per_k")
    )
    print(f"code_lines={figures.code_lines} {shown} longest_at={figures.longest_function_at}")
    if "--list" in argv:
        for where, line in sorted(figures.overrides):
            print(f"{where}:{line}: default-then-override")
    over = [limit for limit in checked if limit.value > limit.most]
    for limit in over:
        print(
            f"readability: {limit.name}={limit.value:.1f} is over its limit of {limit.most:g}",
            file=sys.stderr,
        )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
