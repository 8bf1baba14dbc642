"""The launcher protocol, the credentials a run gets, and the local-process launcher.

A launcher starts attempts, reports how they ended and finds them again after a restart; it never
talks to the gateway. A local attempt is a process group (`WRAPPER`) that writes its exit code to a
file and dies whole at its end or timeout; its 0600 state file (pid, start time, deadline, phase,
grader command and token), written before the spawn, lets a restarted controller adopt it (pid and
start time match) or call it lost. A grader runs after the harness exits 0, with only its own token.
"""

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Self

from agl.types import JSON, FailureKind, Status
from controller.spec import Process, Spec

# sh -c WRAPPER EXIT_FILE DIR COMMAND...: the exit code goes to a file, then the whole process group is killed.
WRAPPER = (
    'cd "$1" || exit 126; shift; "$@"; c=$?; echo $c > "$0.tmp" && mv "$0.tmp" "$0"; kill -9 0'
)
INHERITED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "USER",
    "PYTHONPATH",
)  # never the admin key


@dataclass(frozen=True)
class Credentials:
    rollout_id: str
    attempt: int
    task: JSON
    gateway_url: str  # its public URL, which is also the Anthropic base URL
    base_url: str
    agent_token: str
    grader_token: str | None = None

    @classmethod
    def from_reply(cls, reply: JSON, attempt: int, task: JSON) -> Self:
        tokens = reply["agent_token"], reply.get("grader_token")
        return cls(
            reply["id"], attempt, task, reply["anthropic_base_url"], reply["base_url"], *tokens
        )

    def harness_env(self) -> dict[str, str]:
        """DESIGN.md section 3; no grader token."""
        urls = {"OPENAI_BASE_URL": self.base_url, "ANTHROPIC_BASE_URL": self.gateway_url}
        return (
            urls
            | {"OPENAI_API_KEY": self.agent_token, "ANTHROPIC_API_KEY": self.agent_token}
            | self.common_env()
        )

    def grader_env(self) -> dict[str, str]:
        return {"AGL_GRADER_TOKEN": self.grader_token or ""} | self.common_env()

    def common_env(self) -> dict[str, str]:
        env = {
            "AGL_GATEWAY_URL": self.gateway_url,
            "AGL_ROLLOUT_ID": self.rollout_id,
            "AGL_ATTEMPT": str(self.attempt),
        }
        return env | {"AGL_TASK": json.dumps(self.task)}


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended. `SUCCEEDED` means it ran to the end; the loop still checks the reward."""

    status: Status
    failure_kind: FailureKind | None = None
    reason: str = ""

    @classmethod
    def infra(cls, reason: str) -> Self:
        return cls(Status.FAILED, FailureKind.INFRA, reason)

    @classmethod
    def task(cls, reason: str) -> Self:
        return cls(Status.FAILED, FailureKind.TASK, reason)

    @classmethod
    def exited(cls, program: str, code: int) -> Self:
        """A harness that failed is the policy's failure; a grader that failed is not."""
        return (cls.task if program == "harness" else cls.infra)(f"{program} exited with {code}")


OK = Outcome(Status.SUCCEEDED)
Key = tuple[str, int]  # (rollout id, attempt)


class LaunchError(Exception):
    """A launch that did not happen. `permanent`: the spec itself is at fault (a task failure)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Launcher(Protocol):
    async def launch(self, spec: Spec, creds: Credentials) -> str:
        """Start an attempt; returns where it runs (pid, Job name). Raises `LaunchError`."""

    async def adopt(self) -> list[Key]:
        """The attempts this launcher started earlier (e.g. before a restart); now watched again."""

    async def poll(self) -> list[tuple[Key, Outcome]]:
        """Attempts that ended since the last poll. Reported again until `release`d."""

    async def release(self, key: Key) -> None:
        """The loop recorded this outcome: forget the attempt."""

    async def stop(self, key: Key) -> None:
        """End the attempt now (its rollout ended elsewhere: a cancel); `poll` then reports it as usual."""

    def active(self) -> int:
        """Attempts being watched (running or ended but not released)."""


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass
class _Run:
    """One local attempt, as recorded in its state file."""

    rollout_id: str
    attempt: int
    dir: str
    phase: str  # harness | grader
    pid: int = 0
    start: int = 0
    deadline: float = 0.0
    grader: JSON | None = None  # proc (the spec's), env, cwd
    child: bool = field(
        default=False, repr=False
    )  # spawned by this process (else adopted): reap it

    @property
    def key(self) -> Key:
        return self.rollout_id, self.attempt


class LocalLauncher:
    """Harnesses as local processes: a JSON file per attempt in `state_dir/runs`, logs in `state_dir/logs`."""

    def __init__(self, state_dir: str | Path) -> None:
        state = Path(
            state_dir
        ).absolute()  # runs write their exit codes here from their own folders
        self.runs_dir, self.log_dir = state / "runs", state / "logs"
        self.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.runs: dict[Key, _Run] = {}
        self.ended: dict[Key, Outcome] = {}

    def _state_file(self, key: Key) -> Path:
        return self.runs_dir / f"{key[0]}.{key[1]}.json"

    def _save(self, run: _Run) -> None:
        tmp = self._state_file(run.key).with_suffix(".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({k: v for k, v in vars(run).items() if k != "child"}, f)
        tmp.replace(self._state_file(run.key))

    def _spawn(self, run: _Run, proc: Process, env: dict[str, str], cwd: str) -> None:
        exe = proc.command[0]
        if not os.path.isdir(cwd):
            raise LaunchError(f"{run.phase}: working directory {cwd!r} does not exist")
        if not shutil.which(os.path.join(cwd, exe) if "/" in exe else exe, path=env.get("PATH")):
            raise LaunchError(f"{run.phase}: executable {exe!r} not found or not executable")
        exit_file, log = (
            os.path.join(run.dir, f"{run.phase}.exit"),
            os.path.join(run.dir, f"{run.phase}.log"),
        )
        self._save(
            run
        )  # before the spawn: a controller killed right after it finds the run (lost: retried)
        try:  # posix_spawn: a vfork, no Popen object that would outlive (and warn about) an adopted run
            logged = (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            files = [
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                logged,
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ]
            argv = ["/bin/sh", "-c", WRAPPER, exit_file, cwd, *proc.command]
            run.pid = os.posix_spawn("/bin/sh", argv, env, file_actions=files, setsid=True)
        except OSError as e:
            if run.phase == "harness":
                self._state_file(run.key).unlink(missing_ok=True)
            raise LaunchError(f"{run.phase}: cannot start {exe!r}: {e}") from e
        run.child, run.start = True, process_start(run.pid) or 0
        run.deadline = time.time() + proc.timeout_s
        self._save(run)

    async def launch(self, spec: Spec, creds: Credentials) -> str:
        run_dir = self.log_dir / creds.rollout_id / str(creds.attempt)
        workspace = run_dir / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        run = _Run(creds.rollout_id, creds.attempt, str(run_dir), "harness")
        base = {k: os.environ[k] for k in INHERITED if k in os.environ}
        if spec.grader:
            grader_env = base | spec.grader.env | creds.grader_env()
            run.grader = {
                "proc": spec.grader.model_dump(),
                "env": grader_env,
                "cwd": spec.grader.cwd or str(workspace),
            }
        harness_env = base | spec.harness.env | creds.harness_env()
        self._spawn(run, spec.harness, harness_env, spec.harness.cwd or str(workspace))
        self.runs[run.key] = run
        return f"pid {run.pid}"

    async def adopt(self) -> list[Key]:
        for path in sorted(self.runs_dir.glob("*.json")):
            try:
                run = _Run(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)  # written by no version of this code we can read
                continue
            self.runs[run.key] = run
        return list(self.runs)

    def _running(self, run: _Run) -> bool:
        """Whether the current phase's process runs (polled: no thread per process); a child is reaped once ended."""
        if not run.child:
            return bool(run.pid) and process_start(run.pid) == run.start
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(run.pid, os.WNOHANG)[0] == 0:
                return True
        run.child = False
        return False

    def _check(self, run: _Run) -> Outcome | None:
        """How the attempt ended; None while it runs (or its grader has just started)."""
        if self._running(run):
            if time.time() < run.deadline:
                return None
            self._kill(run)
            if run.phase == "grader":
                return Outcome.infra("the grader ran past its timeout")
            return Outcome(Status.TIMED_OUT, FailureKind.TASK, "the harness ran past its timeout")
        try:
            code = int(Path(run.dir, f"{run.phase}.exit").read_text())
        except (OSError, ValueError):
            return Outcome.infra(f"{run.phase} process {run.pid} was lost (no exit code)")
        if code != 0:
            return Outcome.exited(run.phase, code)
        if run.phase == "grader" or not run.grader:
            return OK
        run.phase = "grader"
        try:
            self._spawn(
                run,
                Process.model_validate(run.grader["proc"]),
                run.grader["env"],
                run.grader["cwd"],
            )
        except LaunchError as e:
            return Outcome.infra(str(e))
        return None

    def _kill(self, run: _Run) -> None:
        with contextlib.suppress(OSError):  # the whole group: what it forked dies with it
            os.killpg(run.pid, signal.SIGKILL)
        if run.child:
            os.waitpid(run.pid, 0)

    async def stop(self, key: Key) -> None:
        if (
            (run := self.runs.get(key)) and key not in self.ended and self._running(run)
        ):  # never a reused pid
            self._kill(run)
            self.ended[key] = Outcome.infra(f"{run.phase} stopped: the rollout ended")

    async def poll(self) -> list[tuple[Key, Outcome]]:
        for key, run in list(self.runs.items()):
            if key not in self.ended and (outcome := self._check(run)) is not None:
                self.ended[key] = outcome
        return list(self.ended.items())

    async def release(self, key: Key) -> None:
        self.ended.pop(key, None)
        self.runs.pop(key, None)
        self._state_file(key).unlink(missing_ok=True)

    def active(self) -> int:
        return len(self.runs)
