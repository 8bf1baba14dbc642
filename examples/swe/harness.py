"""The harness step of a SWE rollout: mini-SWE-agent, unchanged, in the task's repository.

Runs in the rollout's workspace (the controller's working directory; on Kubernetes the emptyDir
shared with the grader), with the Python that has mini-swe-agent installed:

1. The task's tree at `base_commit` becomes a fresh repository with one commit and no remote,
   so the agent can `git diff` its work but cannot reach the history (where the fix lives):
   in place (`--repo` == `--source`, the pod case: the checkout's `.git` is deleted; the grader
   container keeps its own copy), or exported with `git archive` into `--repo` (local runs).
2. `mini -y --exit-immediately` in that repository, its model endpoint and key from the injected
   `OPENAI_BASE_URL` / `OPENAI_API_KEY`; the agent's commands do not see `AGL_*` (the task record
   names the tests).
3. The agent's changes as a binary git diff in `patch.diff`, the trajectory in `traj.json`, and
   `harness.json` (mini's exit status) for the grader.

Exits 0 once the agent ran (whatever it did): grading decides the reward. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

GIT = ["git", "-c", "user.name=agl", "-c", "user.email=agl@localhost", "-c", "commit.gpgsign=false"]
MINI_ENV = {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors"}
MINI_ENV |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def git(repo: Path, *args: str) -> str:
    command = [*GIT, "-C", str(repo), *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def resolve(repo: Path, ref: str) -> str:
    """A commit ID for `ref`, also when it exists only as a remote branch (`origin/<ref>`)."""
    for name in (ref, f"origin/{ref}"):
        command = ["git", "-C", str(repo), "rev-parse", "--verify", "-q", f"{name}^{{commit}}"]
        found = subprocess.run(command, capture_output=True, text=True)
        if found.returncode == 0:
            return found.stdout.strip()
    raise SystemExit(f"harness: {ref} is neither a commit nor a branch of {repo}")


def prepare(source: Path, repo: Path, ref: str) -> None:
    """The tree at `ref` in `repo`, as a new one-commit repository."""
    commit = resolve(source, ref)
    if source.resolve() == repo.resolve():
        git(repo, "checkout", "-q", "-f", commit)
        shutil.rmtree(repo / ".git")
    else:
        repo.mkdir(parents=True, exist_ok=True)
        archive = ["git", "-C", str(source), "archive", commit]
        tree = subprocess.run(archive, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(repo)], input=tree, check=True)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", "task")


def diff(repo: Path) -> bytes:
    """The agent's changes, new files included, as a binary diff against the task's commit."""
    git(repo, "add", "-A")
    command = [*GIT, "-C", str(repo), "diff", "--cached", "--binary", "HEAD"]
    return subprocess.run(command, check=True, capture_output=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="the task repository with its history")
    parser.add_argument(
        "--repo", required=True, help="where the agent works (relative: to the workspace)"
    )
    parser.add_argument("--model", default="openai/policy", help="litellm model name")
    parser.add_argument(
        "--config", action="append", default=[], help="mini-swe-agent config merged over mini.yaml"
    )
    parser.add_argument("--step-limit", type=int, default=100)
    args = parser.parse_args()
    task = json.loads(os.environ["AGL_TASK"])
    workspace = Path.cwd()
    repo = (workspace / args.repo).resolve()
    prepare(Path(args.source), repo, task["base_commit"])

    traj = workspace / "traj.json"
    configs = ["mini.yaml", *args.config, f"agent.step_limit={args.step_limit}"]
    configs.append(f"model.model_kwargs.api_base={os.environ['OPENAI_BASE_URL']}")
    mini = str(Path(sys.executable).parent / "mini")
    cmd = [mini, "-y", "--exit-immediately", "-m", args.model]
    cmd += ["-t", task["problem_statement"], "-o", str(traj)]
    cmd += [arg for c in configs for arg in ("-c", c)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGL_")}
    env |= MINI_ENV | {"MSWEA_GLOBAL_CONFIG_DIR": str(workspace / ".mswea")}
    code = subprocess.run(cmd, cwd=repo, env=env).returncode

    info: dict[str, object] = {"mini_exit_code": code}
    if traj.exists():
        info["exit_status"] = json.loads(traj.read_text()).get("info", {}).get("exit_status")
    try:
        patch = diff(repo)
    except subprocess.CalledProcessError as e:  # e.g. the agent deleted .git: no patch, reward 0
        patch, info["patch_error"] = b"", (e.stderr or b"").decode(errors="replace")[-500:]
    (workspace / "patch.diff").write_bytes(patch)
    (workspace / "harness.json").write_text(json.dumps(info))
    print(
        f"harness: mini exited {code} ({info.get('exit_status')}); patch {len(patch)} bytes",
        flush=True,
    )
    return 0 if traj.exists() else code or 1


if __name__ == "__main__":
    sys.exit(main())
