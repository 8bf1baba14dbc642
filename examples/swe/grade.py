"""The grading step of a SWE rollout, run by the controller with the grader token after the harness.

In the workspace the harness left (`patch.diff`, `harness.json`):

1. A clean checkout of the task at `base_commit` with its history (`--repo` == `--source`: the
   grader container's own copy, in place; else a clone of `--source` into `--repo`), and the
   agent's patch applied to it. A patch that does not apply earns 0.
2. Safeguards on the diff: every changed test configuration file (conftest.py, pytest.ini,
   tox.ini, setup.cfg, pyproject.toml, sitecustomize.py, usercustomize.py, *.pth) and every
   modified or deleted test file is reverted to `test_commit` (default `base_commit`) and flagged;
   new test files are removed (not flagged: agents write reproduction tests). The test files named
   by FAIL_TO_PASS and PASS_TO_PASS are restored from `test_commit`, then `test_patch` (SWE-bench
   records) is applied.
3. The FAIL_TO_PASS and PASS_TO_PASS tests run (`--test-cmd`, default `python -m pytest -rA`,
   without any `AGL_*` variable); reward 1 only if every one of them is reported PASSED.
4. The commands the agent ran, read from the gateway's record of its model calls (not from the
   workspace, which the agent could edit), are scanned for reading git history, reaching the
   network and installing packages.
5. Each finding is posted as an event of kind `flag`, data `{"flag": NAME, ...}` with NAME one of
   `test_edit`, `git_history`, `network`, `package_install`; then a `swe_patch` event (the patch,
   for preds.json), a `swe_grade` event (test results, reverted files, flag counts), and last the
   reward. Flags do not change the reward.

Optional shaping, off by default: `--turn-penalty P` subtracts P per model call beyond
`--free-turns`, `--length-penalty Q` subtracts Q per 1,000 sampled tokens beyond `--free-tokens`;
applied to a passing rollout only, never below 0.

Exits 0 once a reward is posted; non-zero when grading could not happen (an infra failure, which
the controller retries). Standard library only, Python >= 3.8, so it runs in the task's own
environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

TEST_CONFIG = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}
TEST_CONFIG |= {"sitecustomize.py", "usercustomize.py"}
TEST_DIRS = {"test", "tests", "testing"}
MAX_PATCH_CHARS = 1_000_000  # a patch beyond this is cut in its event (it earned its reward whole)
FLAGS = {
    "git_history": re.compile(
        r"\bgit\b[^|;&\n]*?\s(log|show|reflog|rev-list|cat-file|blame|fsck|fetch|pull|clone|ls-remote|bisect"
        r"|whatchanged|shortlog|for-each-ref|checkout\s+\S*[~^]|reset\s+--hard\s+\S*[~^])\b"
        r"|\.git/(objects|refs|logs|packed-refs|ORIG_HEAD|FETCH_HEAD)"
    ),
    "network": re.compile(
        r"(^|[\s;&|(`$])(curl|wget|nc|ncat|netcat|telnet|ssh|scp|sftp|ftp|rsync)\s"
        r"|\bgit\s+(clone|fetch|pull|ls-remote|remote\s+add)\b"
        r"|urlopen|urllib\.request|requests\.(get|post|put|head)\(|socket\.(socket|create_connection)\("
    ),
    "package_install": re.compile(
        r"\b(pip3?|uv\s+pip|conda|mamba|micromamba|apt-get|apt|yum|dnf|apk|npm|yarn|poetry|easy_install)\s+"
        r"(install|add)\b|\bsetup\.py\s+(install|develop)\b"
    ),
}
TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
PARAMETER = re.compile(r"<parameter=\w+>\n?(.*?)</parameter>", re.S)
FENCE = re.compile(r"```[\w-]*\n(.*?)```", re.S)
RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+?)(?: - .*)?$", re.M)


# ------------------------------------------------------------------ what the agent ran


def commands(text: str) -> list[str]:
    """The commands in one model reply: tool calls (JSON or <parameter=...> form), else fenced blocks."""
    blocks = TOOL_CALL.findall(text)
    if not blocks:
        return FENCE.findall(text)
    found = []
    for block in blocks:
        try:
            arguments = json.loads(block)["arguments"]
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            found += [str(v) for v in arguments.values()]
        except (ValueError, KeyError, TypeError, AttributeError):
            found += PARAMETER.findall(block) or [block]
    return found


def scan(command: str) -> list[tuple[str, str]]:
    """(flag, matched text) for each kind of forbidden action in one command."""
    return [
        (name, m.group(0).strip())
        for name, pattern in FLAGS.items()
        if (m := pattern.search(command))
    ]


# ------------------------------------------------------------------ the repository


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    command = ["git", "-C", str(repo), *args]
    done = subprocess.run(command, input=stdin, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode(errors="replace")


def succeeds(*argv: str, stdin: bytes | None = None) -> bool:
    return subprocess.run(argv, input=stdin, capture_output=True).returncode == 0


def exists(repo: Path, commit: str, path: str) -> bool:
    return succeeds("git", "-C", str(repo), "cat-file", "-e", f"{commit}:{path}")


def apply(repo: Path, patch: bytes) -> bool:
    if not patch.strip():
        return True
    return succeeds("git", "-C", str(repo), "apply", "--binary", "-", stdin=patch)


def file_kind(path: str, named: set[str]) -> str | None:
    """'config' for test configuration, 'test' for a test file, else None."""
    name = path.rsplit("/", 1)[-1]
    if name in TEST_CONFIG or name.endswith(".pth"):
        return "config"
    in_test_dir = any(part in TEST_DIRS for part in path.split("/")[:-1])
    if path in named or name.startswith("test_") or name.endswith("_test.py") or in_test_dir:
        return "test"
    return None


def resolve(repo: Path, ref: str) -> str:
    """A commit ID for `ref`, also when it exists only as a remote branch (`origin/<ref>`)."""
    for name in (ref, f"origin/{ref}"):
        if succeeds("git", "-C", str(repo), "rev-parse", "--verify", "-q", f"{name}^{{commit}}"):
            return git(repo, "rev-parse", f"{name}^{{commit}}").strip()
    raise RuntimeError(f"{ref} is neither a commit nor a branch of {repo}")


def checkout(source: Path, repo: Path, commit: str) -> None:
    if source.resolve() != repo.resolve():
        subprocess.run(["rm", "-rf", str(repo)], check=True)
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(source), str(repo)], check=True)
    git(repo, "checkout", "-q", "-f", commit)
    git(repo, "clean", "-fdq")


def safeguard(
    repo: Path, base: str, tests_at: str, named: set[str]
) -> tuple[list[dict], list[str]]:
    """Revert test edits (module docstring, step 2); the flags and the removed new test files."""
    git(repo, "add", "-A")
    flags, removed = [], []
    for line in git(repo, "diff", "--cached", "--name-status", "--no-renames", base).splitlines():
        change, path = line.split("\t", 1)
        kind = file_kind(path, named)
        if kind is None:
            continue
        if exists(repo, tests_at, path):
            git(repo, "checkout", tests_at, "--", path)
        else:
            (repo / path).unlink(missing_ok=True)
        if kind == "config" or change != "A":
            flags.append({"flag": "test_edit", "path": path, "change": change, "kind": kind})
        else:
            removed.append(path)
    for path in sorted(named):
        if exists(repo, tests_at, path):
            git(repo, "checkout", tests_at, "--", path)
    return flags, removed


def run_tests(repo: Path, tests: list[str], command: str, timeout_s: float) -> dict[str, str]:
    """Each test ID -> PASSED / FAILED / ... / MISSING / TIMEOUT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    argv = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider"]
    if command:
        argv = shlex.split(command)
    try:
        done = subprocess.run(
            [*argv, *tests], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return dict.fromkeys(tests, "TIMEOUT")
    print(done.stdout[-5000:], done.stderr[-2000:], sep="\n", flush=True)
    seen = {test: status for status, test in RESULT.findall(done.stdout)}
    return {test: seen.get(test, "MISSING") for test in tests}


# ------------------------------------------------------------------ the gateway


class Gateway:
    """This rollout's part of the admin API, with the grader token."""

    def __init__(self) -> None:
        self.url = f"{os.environ['AGL_GATEWAY_URL'].rstrip('/')}/api/rollouts/{os.environ['AGL_ROLLOUT_ID']}"
        self.headers = {
            "Authorization": "Bearer " + os.environ["AGL_GRADER_TOKEN"],
            "Content-Type": "application/json",
        }

    def call(self, method: str, path: str, body: object = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, headers=self.headers, method=method
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read() or b"null")

    def event(self, kind: str, data: dict) -> None:
        self.call("POST", "/events", {"kind": kind, "data": data})


def shaped(reward: float, calls: list[dict], args: argparse.Namespace) -> float:
    if reward <= 0:
        return reward
    sampled = sum(len(c.get("response_ids") or []) for c in calls)
    reward -= args.turn_penalty * max(0, len(calls) - args.free_turns)
    reward -= args.length_penalty * max(0.0, (sampled - args.free_tokens) / 1000)
    return max(0.0, reward)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="the task repository with its history")
    parser.add_argument("--repo", required=True, help="where to grade (relative: to the workspace)")
    parser.add_argument("--test-cmd", default="", help="test runner argv (test IDs are appended)")
    parser.add_argument("--test-timeout", type=float, default=600.0)
    parser.add_argument("--turn-penalty", type=float, default=0.0)
    parser.add_argument("--free-turns", type=int, default=0)
    parser.add_argument("--length-penalty", type=float, default=0.0)
    parser.add_argument("--free-tokens", type=int, default=0)
    args = parser.parse_args()
    task = json.loads(os.environ["AGL_TASK"])
    workspace, source = Path.cwd(), Path(args.source)
    repo = (workspace / args.repo).resolve()
    gateway = Gateway()
    harness = {}
    if (workspace / "harness.json").exists():
        harness = json.loads((workspace / "harness.json").read_text())
    patch = (workspace / "patch.diff").read_bytes() if (workspace / "patch.diff").exists() else b""

    base = resolve(source, task["base_commit"])
    tests_at = resolve(source, task.get("test_commit") or task["base_commit"])
    checkout(source, repo, base)
    tests = list(task["FAIL_TO_PASS"]) + list(task["PASS_TO_PASS"])
    named = {t.split("::", 1)[0] for t in tests}
    applied = apply(repo, patch)
    flags, removed = safeguard(repo, base, tests_at, named) if applied else ([], [])
    if task.get("test_patch"):
        git(repo, "apply", "-", stdin=task["test_patch"].encode())
    results = run_tests(repo, tests, args.test_cmd, args.test_timeout) if applied else {}
    passed = applied and bool(tests) and all(results[t] in ("PASSED", "XFAIL") for t in tests)

    calls = gateway.call("GET", "/calls")
    assert isinstance(calls, list)
    for call in calls:
        for command in commands((call.get("response") or {}).get("text", "")):
            for name, match in scan(command):
                flags.append(
                    {
                        "flag": name,
                        "call_seq": call.get("seq"),
                        "match": match,
                        "command": command[:500],
                    }
                )
    reward = shaped(1.0 if passed else 0.0, calls, args)
    for flag in flags:
        gateway.event("flag", flag)
    text = patch.decode(errors="replace")
    # preds.json gets what fits in an event
    cut = {"truncated": True} if len(text) > MAX_PATCH_CHARS else {}
    event = {"instance_id": task["instance_id"], "model_patch": text[:MAX_PATCH_CHARS], **cut}
    gateway.event("swe_patch", event)
    counts: dict[str, int] = {}
    for flag in flags:
        counts[flag["flag"]] = counts.get(flag["flag"], 0) + 1
    summary = {
        "instance_id": task["instance_id"],
        "reward": reward,
        "patch_applied": applied,
        "results": results,
    }
    summary.update(flags=counts, removed_test_files=removed, exit_status=harness.get("exit_status"))
    gateway.event("swe_grade", summary)
    gateway.call("POST", "/reward", {"reward": reward, "source": "grader"})
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
