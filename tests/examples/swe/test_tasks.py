"""The cleaning pipeline on the shipped sample reproduces the checked-in report."""

from __future__ import annotations

import json
from pathlib import Path

from examples.swe import tasks

DATA = Path(__file__).parents[3] / "examples" / "swe" / "data"
SAMPLE = ["--tasks", str(DATA / "sample.jsonl"), "--never-solved-share", "0.5"]
SAMPLE += ["--validation-share", "0.25"]


def test_the_sample_reproduces_its_report(tmp_path: Path, capsys) -> None:
    argv = ["clean", *SAMPLE, "--available", str(DATA / "sample.available.json")]
    argv += ["--probe", str(DATA / "sample.probe.json"), "--out", str(tmp_path)]
    assert tasks.main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == json.loads((DATA / "sample.report.json").read_text())
    train = tasks.load(str(tmp_path / "train.jsonl"))
    validation = tasks.load(str(tmp_path / "validation.jsonl"))
    split = report["split"]
    assert (len(train), len(validation)) == (split["train"], split["validation"]) == (4, 3)
    kept = {t.instance_id for t in train + validation}
    assert "toy__calc.0a1b2c3d.func_pm_op_swap__add" in kept  # mixed outcomes
    assert "toy__strings.9f8e7d6c.func_pm_op_swap__upper" not in kept  # always solved
    find = next(t for t in train + validation if t.instance_id.endswith("find"))
    # SWE-bench's JSON-string lists are parsed
    assert find.FAIL_TO_PASS == ["tests/test_find.py::test_missing"]
    # carried, never shown to the agent
    assert "patch" not in find.rollout_task() and find.record()["patch"]


def test_unchecked_steps_are_noted_not_guessed(tmp_path: Path, capsys) -> None:
    assert tasks.main(["clean", *SAMPLE, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    steps = [s["step"] for s in report["steps"]]
    assert steps == ["empty_problem_statement", "too_many_tests", "duplicate"]
    assert [n.split(":")[0] for n in report["notes"]] == ["missing_image_or_branch", "difficulty"]
    assert report["kept"] == 18 - 2 - 1 - 2
