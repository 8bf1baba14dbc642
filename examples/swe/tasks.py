"""SWE-smith task records: loading, the cleaning pipeline with its report, the train/validation split.

`python -m examples.swe.tasks clean --tasks SRC --out DIR [--available FILE | --online] [--probe FILE]`
reads task records (a local JSONL, or a Hugging Face dataset name when the hub is reachable),
runs the steps below in order, and writes `DIR/train.jsonl`, `DIR/validation.jsonl` and
`DIR/report.json` (what each step removed, with up to five example IDs, and notes on skipped
steps):

1. `empty_problem_statement`: nothing for the agent to read.
2. `too_many_tests`: more than `--max-tests` (200) FAIL_TO_PASS + PASS_TO_PASS tests.
3. `missing_image_or_branch`: the task's image or git branch does not exist. Checked against a
   listing (`--available`, JSON `{"images": [...], "branches": {"owner/repo": [...]}}`) or
   online (`--online`: Docker Hub and `git ls-remote`, once per image and repository); with
   neither, or when the registry cannot be reached, the step is skipped and the report says so.
4. `duplicate`: the same instance ID, or the same problem statement in the same repository.
5. `difficulty`: from a difficulty probe (`examples/swe/probe.py`: the base model k times per task
   through agl): drop always-solved tasks, keep mixed ones, keep a share (`--never-solved-share`)
   of never-solved ones, chosen by a stable hash; tasks the probe did not finish are dropped.
   Skipped with a note when no probe file is given.
6. split: `--validation-share` of the remaining tasks, chosen by a stable hash of the instance ID.

It does not run tasks (that is the probe and the controller) and never reads a task's gold patch
or bug patch beyond carrying it in the record (`rollout_task()` leaves them out, so the agent
never sees them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MAX_EXAMPLES = 5  # example IDs listed per step in the report


@dataclass(frozen=True)
class Task:
    """One SWE-smith task. `base_commit` is what the agent starts from (SWE-smith: the task's
    branch, named like the instance); `test_commit` is where the grader restores test files from
    (default: `base_commit`)."""

    instance_id: str
    repo: str
    image_name: str
    base_commit: str
    problem_statement: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    test_commit: str = ""
    test_patch: str = ""  # SWE-bench records: tests applied by the grader (not shown to the agent)
    extra: dict[str, Any] = field(default_factory=dict)  # other fields, kept as they came

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Task:
        def tests(value: Any) -> list[str]:
            return list(json.loads(value) if isinstance(value, str) else value or [])

        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        return cls(
            instance_id=str(record["instance_id"]),
            repo=str(record.get("repo", "")),
            image_name=str(record.get("image_name", "")),
            base_commit=str(record.get("base_commit") or record["instance_id"]),
            problem_statement=str(record.get("problem_statement") or ""),
            FAIL_TO_PASS=tests(record.get("FAIL_TO_PASS")),
            PASS_TO_PASS=tests(record.get("PASS_TO_PASS")),
            test_commit=str(record.get("test_commit") or ""),
            test_patch=str(record.get("test_patch") or ""),
            extra={k: v for k, v in record.items() if k not in known},
        )

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        return out.pop("extra") | out

    def rollout_task(self) -> dict[str, Any]:
        """The rollout's `task` (the harness sees it as AGL_TASK): no gold or bug patch."""
        return {k: v for k, v in self.record().items() if k not in ("patch", "gold_patch")}


def load(source: str, split: str = "train") -> list[Task]:
    """Tasks from a JSONL file, or from a Hugging Face dataset (`datasets` and the hub needed)."""
    if Path(source).exists():
        lines = Path(source).read_text().splitlines()
        return [Task.from_record(json.loads(line)) for line in lines if line.strip()]
    import datasets  # only for hub datasets

    return [Task.from_record(dict(r)) for r in datasets.load_dataset(source, split=split)]


def stable_fraction(key: str, seed: int) -> float:
    """A number in [0, 1) that depends only on `key` and `seed` (not on order or process)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


# ------------------------------------------------------------------ existence of images and branches

Checker = Callable[[Task], str | None]  # a reason when the task's image or branch is missing


def listing_checker(path: Path) -> Checker:
    found = json.loads(path.read_text())
    images = set(found.get("images", []))
    branches = {k: set(v) for k, v in found.get("branches", {}).items()}

    def check(task: Task) -> str | None:
        if task.image_name not in images:
            return f"image {task.image_name} not found"
        if task.base_commit not in branches.get(task.repo, set()):
            return f"branch {task.base_commit} not in {task.repo}"
        return None

    return check


class Unreachable(Exception):
    """The registry or git host cannot be reached: the check is skipped, not failed."""


def image_exists(image: str, timeout_s: float) -> bool:
    """Whether Docker Hub has the image (`namespace/name:tag`); Unreachable when it cannot say."""
    name, _, tag = image.partition(":")
    namespace, _, repo = name.rpartition("/")
    url = (
        f"https://hub.docker.com/v2/namespaces/{namespace or 'library'}/repositories/{repo}"
        f"/tags/{tag or 'latest'}"
    )
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise Unreachable(f"{url}: {e}") from e
    except OSError as e:
        raise Unreachable(f"{url}: {e}") from e


def remote_branches(repo: str) -> set[str]:
    """The branches of a GitHub repository (`git ls-remote`); Unreachable when it cannot say."""
    url = f"https://github.com/{repo}"
    command = ["git", "ls-remote", "--heads", url]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unreachable(f"{url}: {e}") from e
    if done.returncode != 0 and "not found" not in done.stderr:
        raise Unreachable(f"{url}: {done.stderr.strip()[:200]}")
    heads = [line for line in done.stdout.splitlines() if "refs/heads/" in line]
    return {line.split("refs/heads/", 1)[1] for line in heads}


def online_checker(timeout_s: float = 10.0) -> Checker:
    """Docker Hub (`namespace/name:tag`) and GitHub branches (`git ls-remote`), one query per image
    and per repository."""
    images: dict[str, bool] = {}
    heads: dict[str, set[str]] = {}

    def check(task: Task) -> str | None:
        if task.image_name not in images:
            images[task.image_name] = image_exists(task.image_name, timeout_s)
        if not images[task.image_name]:
            return f"image {task.image_name} not found"
        if task.repo not in heads:
            heads[task.repo] = remote_branches(task.repo)
        if task.base_commit not in heads[task.repo]:
            return f"branch {task.base_commit} not in {task.repo}"
        return None

    return check


# ------------------------------------------------------------------ the pipeline


@dataclass
class Report:
    input: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept: int = 0
    split: dict[str, int] = field(default_factory=dict)

    def step(
        self, name: str, tasks: Iterable[Task], reason: Callable[[Task], str | None]
    ) -> list[Task]:
        kept, removed = [], []
        for task in tasks:
            why = reason(task)
            (removed if why else kept).append((task, why))
        examples = [{"instance_id": t.instance_id, "why": why} for t, why in removed[:MAX_EXAMPLES]]
        self.steps.append({"step": name, "removed": len(removed), "examples": examples})
        return [t for t, _ in kept]


def difficulty(
    probe: dict[str, list[float]], never_solved_share: float, seed: int
) -> Callable[[Task], str | None]:
    def reason(task: Task) -> str | None:
        rewards = probe.get(task.instance_id)
        if not rewards:
            return "not probed"
        solved = sum(r >= 1.0 for r in rewards)
        if solved == len(rewards):
            return f"always solved ({solved}/{len(rewards)})"
        if solved == 0 and stable_fraction(task.instance_id, seed) >= never_solved_share:
            return f"never solved (0/{len(rewards)}), beyond the kept share"
        return None

    return reason


def clean(
    tasks: list[Task],
    *,
    max_tests: int = 200,
    checker: Checker | None = None,
    probe: dict[str, list[float]] | None = None,
    never_solved_share: float = 0.2,
    validation_share: float = 0.05,
    seed: int = 0,
) -> tuple[list[Task], list[Task], Report]:
    """The cleaning pipeline (module docstring); returns (train, validation, report)."""
    report = Report(input=len(tasks))
    tasks = report.step(
        "empty_problem_statement", tasks, lambda t: None if t.problem_statement.strip() else "empty"
    )

    def too_many(task: Task) -> str | None:
        n = len(task.FAIL_TO_PASS) + len(task.PASS_TO_PASS)
        return f"{n} tests" if n > max_tests else None

    tasks = report.step("too_many_tests", tasks, too_many)
    if checker is None:
        report.notes.append(
            "missing_image_or_branch: not checked (no listing given, --online not set)"
        )
    else:
        try:
            tasks = report.step("missing_image_or_branch", tasks, checker)
        except Unreachable as e:
            report.notes.append(f"missing_image_or_branch: not checked, registry unreachable: {e}")
    seen: set[tuple[str, str]] = set()

    def duplicate(task: Task) -> str | None:
        keys = {("id", task.instance_id), (task.repo, " ".join(task.problem_statement.split()))}
        if hit := keys & seen:
            if ("id", task.instance_id) in hit:
                return "same instance ID"
            return "same problem statement in this repo"
        seen.update(keys)
        return None

    tasks = report.step("duplicate", tasks, duplicate)
    if probe is None:
        report.notes.append("difficulty: not probed (no --probe file)")
    else:
        tasks = report.step("difficulty", tasks, difficulty(probe, never_solved_share, seed))
    validation = [
        t for t in tasks if stable_fraction("split:" + t.instance_id, seed) < validation_share
    ]
    train = [t for t in tasks if t not in validation]
    report.kept = len(tasks)
    report.split = {"train": len(train), "validation": len(validation)}
    return train, validation, report


def write_jsonl(path: Path, tasks: Iterable[Task]) -> None:
    path.write_text("".join(json.dumps(t.record(), sort_keys=True) + "\n" for t in tasks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.swe.tasks", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "clean", help="run the cleaning pipeline; write train/validation JSONL and report.json"
    )
    c.add_argument(
        "--tasks",
        required=True,
        help="JSONL file or Hugging Face dataset name (e.g. SWE-bench/SWE-smith)",
    )
    c.add_argument("--split", default="train", help="dataset split (Hugging Face datasets only)")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--max-tests", type=int, default=200)
    c.add_argument("--available", type=Path, help="JSON listing of existing images and branches")
    c.add_argument(
        "--online", action="store_true", help="check images on Docker Hub and branches on GitHub"
    )
    c.add_argument("--probe", type=Path, help="difficulty probe results (examples/swe/probe.py)")
    c.add_argument("--never-solved-share", type=float, default=0.2)
    c.add_argument("--validation-share", type=float, default=0.05)
    c.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    checker = None
    if args.available:
        checker = listing_checker(args.available)
    elif args.online:
        checker = online_checker()
    probe = json.loads(args.probe.read_text())["rewards"] if args.probe else None
    train, validation, report = clean(
        load(args.tasks, args.split),
        max_tests=args.max_tests,
        checker=checker,
        probe=probe,
        never_solved_share=args.never_solved_share,
        validation_share=args.validation_share,
        seed=args.seed,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "validation.jsonl", validation)
    (args.out / "report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    print(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
