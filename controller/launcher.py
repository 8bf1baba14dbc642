"""The launcher protocol, the credentials a run gets, and the local-process launcher.

- A launcher starts attempts, reports how they ended and finds them again after a restart; it
  never talks to the gateway. Attempts are keyed by `AttemptKey` (rollout id, attempt).
- A local attempt is a process group (`WRAPPER`) that writes its exit code to a file and dies
  whole at its end or timeout.
- Its 0600 state file (pid, start time, deadline, phase, grader command and token), written before
  the spawn, lets a restarted controller adopt it (pid and start time match) or call it lost.
- A grader runs after the harness exits 0, with only its own token.
- How the exit codes become an outcome is `outcome.py`'s rule, not this module's.
"""

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, Self

from agl.types import JSON
from controller.outcome import KILLED, Outcome, exited
from controller.spec import Process, Spec

# sh -c WRAPPER EXIT_FILE DIR COMMAND...: the exit code goes to a file, then the whole process
# group is killed.
WRAPPER = (
    'cd "$1" || exit 126; shift; "$@"; c=$?; echo $c > "$0.tmp" && mv "$0.tmp" "$0"; kill -9 0'
)
# What a run inherits of the controller's environment: never the admin key.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "PYTHONPATH")


class AttemptKey(NamedTuple):
    """One attempt of a rollout: what launchers key their runs by."""

    rollout_id: str
    attempt: int


@dataclass(frozen=True)
class Credentials:
    """What one attempt is given: where the gateway is, and its tokens."""

    rollout_id: str
    attempt: int
    task: JSON
    gateway_url: str  # its public URL, which is also the Anthropic base URL
    base_url: str
    agent_token: str
    grader_token: str | None = None

    @classmethod
    def from_reply(cls, reply: JSON, attempt: int, task: JSON) -> Self:
        """From the gateway's create or rotate reply."""
        return cls(
            rollout_id=reply["id"],
            attempt=attempt,
            task=task,
            gateway_url=reply["anthropic_base_url"],
            base_url=reply["base_url"],
            agent_token=reply["agent_token"],
            grader_token=reply.get("grader_token"),
        )

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(rollout_id=self.rollout_id, attempt=self.attempt)

    def harness_env(self) -> dict[str, str]:
        """The harness's: both SDKs' base URLs and keys (the agent token); no grader token."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "ANTHROPIC_BASE_URL": self.gateway_url,
            "OPENAI_API_KEY": self.agent_token,
            "ANTHROPIC_API_KEY": self.agent_token,
        } | self.common_env()

    def grader_env(self) -> dict[str, str]:
        """The grader's: its own token and where to post the reward; no agent token."""
        return {"AGL_GRADER_TOKEN": self.grader_token or ""} | self.common_env()

    def common_env(self) -> dict[str, str]:
        """What every program of the attempt is told: the gateway, the rollout and its task."""
        return {
            "AGL_GATEWAY_URL": self.gateway_url,
            "AGL_ROLLOUT_ID": self.rollout_id,
            "AGL_ATTEMPT": str(self.attempt),
            "AGL_TASK": json.dumps(self.task),
        }


class LaunchError(Exception):
    """A launch that did not happen. `permanent`: the spec itself is at fault (a task failure)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Launcher(Protocol):
    """Where attempts run: local processes (`LocalLauncher`) or Kubernetes Jobs (`KubeLauncher`)."""

    async def launch(self, spec: Spec, creds: Credentials) -> str:
        """Start an attempt; returns where it runs (pid, Job name). Raises `LaunchError`."""

    async def adopt(self) -> list[AttemptKey]:
        """The attempts this launcher started earlier (e.g. before a restart); now watched again."""

    async def poll(self) -> list[tuple[AttemptKey, Outcome]]:
        """Attempts that ended since the last poll. Reported again until `release`d."""

    async def release(self, key: AttemptKey) -> None:
        """The loop recorded this outcome: forget the attempt."""

    async def stop(self, key: AttemptKey) -> None:
        """End the attempt now (its rollout ended elsewhere: a cancel); `poll` then reports it."""

    def active(self) -> int:
        """Attempts being watched (running or ended but not released)."""


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


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
    # Spawned by this process (else adopted): reap it.
    child: bool = field(default=False, repr=False)

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(rollout_id=self.rollout_id, attempt=self.attempt)


class LocalLauncher:
    """Harnesses as local processes: a JSON file per attempt in `state_dir/runs`, logs in
    `state_dir/logs`."""

    def __init__(self, state_dir: str | Path) -> None:
        # Absolute: runs write their exit codes here from their own folders.
        state = Path(state_dir).absolute()
        self.runs_dir = state / "runs"
        self.log_dir = state / "logs"
        self.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.runs: dict[AttemptKey, _Run] = {}
        self.ended: dict[AttemptKey, Outcome] = {}

    def _state_file(self, key: AttemptKey) -> Path:
        return self.runs_dir / f"{key.rollout_id}.{key.attempt}.json"

    def _save(self, run: _Run) -> None:
        tmp = self._state_file(run.key).with_suffix(".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump({k: v for k, v in vars(run).items() if k != "child"}, f)
        tmp.replace(self._state_file(run.key))

    def _spawn(self, run: _Run, proc: Process, env: dict[str, str], cwd: str) -> None:
        """Start the run's current phase as `proc`; its state file is saved before and after."""
        _check_runnable(run.phase, proc, env, cwd)
        # Saved before the spawn: a controller killed right after it finds the run (lost: retried).
        self._save(run)
        try:
            run.pid = _posix_spawn(run, proc, env, cwd)
        except OSError as e:
            if run.phase == "harness":
                self._state_file(run.key).unlink(missing_ok=True)
            raise LaunchError(f"{run.phase}: cannot start {proc.command[0]!r}: {e}") from e
        run.child = True
        run.start = process_start(run.pid) or 0
        run.deadline = time.time() + proc.timeout_s
        self._save(run)

    async def launch(self, spec: Spec, creds: Credentials) -> str:
        run_dir = self.log_dir / creds.rollout_id / str(creds.attempt)
        workspace = run_dir / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        run = _Run(
            rollout_id=creds.rollout_id, attempt=creds.attempt, dir=str(run_dir), phase="harness"
        )
        base = {k: os.environ[k] for k in INHERITED if k in os.environ}
        if spec.grader:
            run.grader = {
                "proc": spec.grader.model_dump(),
                "env": base | spec.grader.env | creds.grader_env(),
                "cwd": spec.grader.cwd or str(workspace),
            }
        harness_env = base | spec.harness.env | creds.harness_env()
        self._spawn(run, spec.harness, harness_env, spec.harness.cwd or str(workspace))
        self.runs[run.key] = run
        return f"pid {run.pid}"

    async def adopt(self) -> list[AttemptKey]:
        for path in sorted(self.runs_dir.glob("*.json")):
            try:
                run = _Run(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                # Written by no version of this code we can read.
                path.unlink(missing_ok=True)
                continue
            self.runs[run.key] = run
        return list(self.runs)

    def _running(self, run: _Run) -> bool:
        """Whether the current phase's process runs (polled: no thread per process); a child is
        reaped once ended."""
        if not run.child:
            return bool(run.pid) and process_start(run.pid) == run.start
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(run.pid, os.WNOHANG)[0] == 0:
                return True
        run.child = False
        return False

    def _exit_code(self, run: _Run) -> int | None:
        """The ended phase's exit code; None if its wrapper wrote none (it was lost)."""
        try:
            return int(Path(run.dir, f"{run.phase}.exit").read_text())
        except (OSError, ValueError):
            return None

    def _check(self, run: _Run) -> Outcome | None:
        """How the attempt ended; None while it runs (or its grader has just started). A phase
        past its deadline is killed, as `timeout -k` would."""
        if not self._running(run):
            code = self._exit_code(run)
        elif time.time() < run.deadline:
            return None
        else:
            self._kill(run)
            code = KILLED
        if run.phase == "grader":
            return exited(0, code, graded=True)
        if code != 0 or not run.grader:
            return exited(code, graded=bool(run.grader))
        run.phase = "grader"
        grader = Process.model_validate(run.grader["proc"])
        try:
            self._spawn(run, grader, run.grader["env"], run.grader["cwd"])
        except LaunchError as e:
            return Outcome.launch_failed(str(e), permanent=e.permanent)
        return None

    def _kill(self, run: _Run) -> None:
        # The whole group: what it forked dies with it.
        with contextlib.suppress(OSError):
            os.killpg(run.pid, signal.SIGKILL)
        if run.child:
            os.waitpid(run.pid, 0)

    async def stop(self, key: AttemptKey) -> None:
        run = self.runs.get(key)
        # Only a run that still runs: never a reused pid.
        if run and key not in self.ended and self._running(run):
            self._kill(run)
            self.ended[key] = Outcome.stopped(f"{run.phase} stopped: the rollout ended")

    async def poll(self) -> list[tuple[AttemptKey, Outcome]]:
        for key, run in list(self.runs.items()):
            if key in self.ended:
                continue
            outcome = self._check(run)
            if outcome is not None:
                self.ended[key] = outcome
        return list(self.ended.items())

    async def release(self, key: AttemptKey) -> None:
        self.ended.pop(key, None)
        self.runs.pop(key, None)
        self._state_file(key).unlink(missing_ok=True)

    def active(self) -> int:
        return len(self.runs)


def _check_runnable(phase: str, proc: Process, env: dict[str, str], cwd: str) -> None:
    """Raise `LaunchError` if the program cannot start: no working directory, no executable."""
    exe = proc.command[0]
    if not os.path.isdir(cwd):
        raise LaunchError(f"{phase}: working directory {cwd!r} does not exist")
    if "/" in exe:
        exe = os.path.join(cwd, exe)
    if not shutil.which(exe, path=env.get("PATH")):
        raise LaunchError(f"{phase}: executable {proc.command[0]!r} not found or not executable")


def _posix_spawn(run: _Run, proc: Process, env: dict[str, str], cwd: str) -> int:
    """Start `proc` under `WRAPPER` in a session of its own, its output appended to the phase's
    log; its pid. posix_spawn: a vfork, and no Popen object that would outlive (and warn about)
    an adopted run."""
    exit_file = os.path.join(run.dir, f"{run.phase}.exit")
    log = os.path.join(run.dir, f"{run.phase}.log")
    files = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    argv = ["/bin/sh", "-c", WRAPPER, exit_file, cwd, *proc.command]
    return os.posix_spawn("/bin/sh", argv, env, file_actions=files, setsid=True)
