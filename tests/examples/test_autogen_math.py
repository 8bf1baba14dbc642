"""examples/autogen_math: the AutoGen agent's calculator and reward, its tasks, and two training
steps of its train.yaml on the tiny model, with the agent running unchanged from its own venv
(built here when missing)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.autogen_math import tasks as tasks_py
from examples.autogen_math.tools import calculator, final_number, reward
from tests.examples.training import train_example

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "autogen_math"


# -------------------------------------------------------------------- the tool and the reward


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("37 * 24 - 158", "730"),
        ("(12 + 3) * 4", "60"),
        ("7 / 2", "3.5"),
        ("2 ** 10", "1024"),
        ("-3 + +5", "2"),
    ],
)
def test_the_calculator_evaluates_arithmetic(expression: str, result: str) -> None:
    assert calculator(expression) == result


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "1 / 0", "9 ** 9 ** 9", "2 **", "", "x + 1", "True + 1", "'a' * 3"],
)
def test_the_calculator_reports_what_it_cannot_evaluate(expression: str) -> None:
    assert calculator(expression).startswith("error: ")


@pytest.mark.parametrize(
    ("reply", "number"),
    [
        ("Answer: 730", 730),
        # the number after "Answer:", not the last one
        ("37 * 24 = 888, minus 158 is 730.\nAnswer: 730", 730),
        ("Answer: 1,234 apples", 1234),
        ("Answer: $637", 637),
        ("Answer: -5 degrees", -5),
        ("The train travels 349 km.", 349),  # no "Answer:": the last number
        ("I cannot tell.", None),
    ],
)
def test_the_final_number(reply: str, number: float | None) -> None:
    assert final_number(reply) == number


def test_the_reward_is_one_for_the_right_number_only() -> None:
    assert reward("Answer: 730", 730) == reward("The answer is 730.0", 730) == 1.0
    assert reward("Answer: 731", 730) == reward("Answer: 73", 730) == reward("no idea", 730) == 0.0


def test_the_tasks_are_the_ones_tasks_py_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks_py, "HERE", tmp_path)
    tasks_py.main()
    for name in ("tasks.jsonl", "val.jsonl"):
        assert (tmp_path / name).read_text() == (HERE / name).read_text()
    train = [json.loads(line) for line in (HERE / "tasks.jsonl").read_text().splitlines()]
    val = [json.loads(line) for line in (HERE / "val.jsonl").read_text().splitlines()]
    assert (len(train), len(val)) == (40, 20)
    assert not {t["question"] for t in train} & {t["question"] for t in val}
    assert all(isinstance(t["answer"], int) and t["answer"] > 0 for t in train + val)


# -------------------------------------------------------------------- training


@pytest.fixture(scope="session")
def autogen_venv() -> Path:
    """examples/autogen_math/.venv, built by venv.sh unless a finished build is there (needs PyPI)."""
    python = HERE / ".venv" / "bin" / "python"
    if not (HERE / ".venv" / ".installed").exists():
        uv = Path(sys.executable).parent / "uv"
        # this interpreter: uv downloads none
        env = os.environ | {"UV": str(uv), "PYTHON": sys.executable}
        subprocess.run(["sh", str(HERE / "venv.sh")], check=True, env=env, timeout=240)
    return python


def tool_call(expression: str) -> str:
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def script(answer: int) -> list[str]:
    """Every text states an answer and calls the calculator, so every rollout makes exactly four
    calls whatever the interleaving: three rounds of tool calls (AutoGen's max_tool_iterations),
    then AutoGen's reflection, offered no tools, whose text is read as the reply. In each block of
    16 texts (the four rollouts of two groups), only the last one, which is always some rollout's
    reflection, gives the right answer: one rollout of the first batch is right and its group has
    mixed rewards. The wrong answers' tool calls include ones the calculator reports as errors."""
    expressions = ["19 * 22 - 229", "19 * 22", "19 * 22 -", "229 / 0"]
    wrong = [f"Answer: {answer + 1 + i % 3}\n{tool_call(expressions[i % 4])}" for i in range(15)]
    return [*wrong, f"Answer: {answer}\n{tool_call(expressions[0])}"] * 30


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_training_steps_train_the_solver(
    autogen_venv: Path,
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    # "A baker fills 19 trays ...": 189
    task = json.loads((HERE / "val.jsonl").read_text().splitlines()[0])
    assert task["answer"] == 189
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    cache = tmp_path / "tiktoken"
    overrides = ["agl.n=2", "agl.batch_groups=2", "agl.active_groups=2"]
    overrides.append(f"agl.tasks={tmp_path / 'tasks.jsonl'}")
    # where tiktoken would download to
    overrides.append(f"agl.spec.harness.env.TIKTOKEN_CACHE_DIR={cache}")
    texts = script(task["answer"])
    steps, calls = train_example(HERE / "train.yaml", tiny_path, tmp_path, texts, *overrides)

    assert len(steps) == 2
    for m in steps:  # one agent, trained: no untrained calls
        assert {k for k in m if k.startswith("calls/")} <= {"calls/solver/trained"}
        assert m["adapter/calls_untrained"] == 0
    assert sum(m.get("calls/solver/trained", 0) for m in steps) > 0
    # the first batch's, at least (script)
    trained = [m for m in steps if m["adapter/rollouts_trained"] > 0]
    assert trained
    assert all(m["adapter/trained_tokens"] > 0 for m in trained)
    assert all(math.isfinite(m["actor/grad_norm"]) for m in trained)

    # AutoGen's tool loop went through the gateway: the calculator offered, its calls parsed into API
    # tool calls, run by AutoGen and their results sent back; the reflection offered no tools.
    finished = [c for c in calls.values() if len(c) == 4]
    assert finished and all(c.agent == "solver" for cs in calls.values() for c in cs)
    for rollout in finished:
        offered = [bool(c.request.get("tools")) for c in rollout]
        assert offered == [True, True, True, False]
        results = [m["content"] for m in rollout[-1].request["messages"] if m["role"] == "tool"]
        assert len(results) == 3
        assert all(r == "189" or r.startswith("error: ") or r == "418" for r in results)
    assert not cache.exists()  # nothing in the harness asked tiktoken for an encoding
