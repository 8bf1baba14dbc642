"""tools/readability.py: which default-then-override pairs it counts, and how it reports them.

Each case is a small source file measured as the tool measures a tree; the other figures are
covered by `make lint`, which runs the tool over the code.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readability", ROOT / "tools" / "readability.py")
assert _spec is not None and _spec.loader is not None
readability = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readability)


def overrides(source: str) -> list[int]:
    """The lines of the pairs the tool counts in `source`."""
    figures = readability.Figures()
    readability.count_nodes(ast.parse(textwrap.dedent(source)), "f.py", figures)
    return sorted(line for _, line in figures.overrides)


SYMMETRIC = {
    "two strings": 'kind = "GPU"\nif on_cpu:\n    kind = "CPU"\n',
    "two f-strings": 'cmd = f"pip {s}"\nif gpu:\n    cmd = f"pip -x {s}"\n',
    "a string and a named constant": 'mode = "start"\nif thinking:\n    mode = REASONING\n',
    "two enum members": "to = Status.QUEUED\nif again:\n    to = Status.RUNNING\n",
    "two numbers": "n = 1\nif wide:\n    n = -4\n",
    "two names": "side = left\nif flip:\n    side = self.right\n",
    "annotated": 'kind: str = "GPU"\nif on_cpu:\n    kind = "CPU"\n',
    "an attribute target": 'self.mode = "a"\nif b:\n    self.mode = "b"\n',
}

EXCEPTIONS = {
    "an override that computes": "count = 1\nif n:\n    count = -(-n // size)\n",
    "a None default": 'headers = None\nif busy:\n    headers = {"Retry-After": "5"}\n',
    "a container": "env = {}\nif on_cpu:\n    env = CPU_ENV\n",
    "a name then a literal": 'verl_role = role\nif role == "ref":\n    verl_role = "actor"\n',
    "a condition reading the target": 'role = given\nif role == "dev":\n    role = other\n',
    "a condition reading the default": "side = left\nif left is None:\n    side = right\n",
    "an else": 'kind = "GPU"\nif on_cpu:\n    kind = "CPU"\nelse:\n    pass\n',
    "an elif": 'kind = "GPU"\nif on_cpu:\n    kind = "CPU"\nelif x:\n    pass\n',
    "two statements in the body": 'kind = "GPU"\nif on_cpu:\n    log()\n    kind = "CPU"\n',
    "another target": 'kind = "GPU"\nif on_cpu:\n    other = "CPU"\n',
    "an augmented assignment": "seconds = 5\nif grader:\n    seconds += 3\n",
    "a statement between": 'kind = "GPU"\nlog()\nif on_cpu:\n    kind = "CPU"\n',
    "two targets": 'a = b = "x"\nif c:\n    a = "y"\n',
}


@pytest.mark.parametrize("source", SYMMETRIC.values(), ids=SYMMETRIC.keys())
def test_a_symmetric_choice_is_counted(source: str) -> None:
    assert overrides(source) == [1]


@pytest.mark.parametrize("source", EXCEPTIONS.values(), ids=EXCEPTIONS.keys())
def test_an_exception_to_a_default_is_not_counted(source: str) -> None:
    assert overrides(source) == []


def test_pairs_are_found_in_every_block() -> None:
    source = """
    def f(x):
        for y in x:
            a = "p"
            if y:
                a = "q"
        try:
            b = 1
            if x:
                b = 2
        finally:
            c = True
            if x:
                c = False
        return a, b, c
    """
    assert overrides(source) == [4, 8, 12]


def test_the_figure_is_reported_and_listed_without_a_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "pkg"
    tree.mkdir()
    (tree / "m.py").write_text('kind = "GPU"\nif on_cpu:\n    kind = "CPU"\n')
    assert readability.main([str(tree)]) == 0
    line = capsys.readouterr().out.strip()
    assert "code_lines=3 " in line
    assert " override_per_k=333.3 " in line
    assert readability.main(["--list", str(tree)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [f"{tree}/m.py:1: default-then-override"]
