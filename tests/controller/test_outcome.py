"""How an attempt ends: one table of the ways, and every path that decides it held to it.

- `CASES`: exit codes and final rewards, held through the rule itself (`controller/outcome.py`),
  local processes through the real controller and gateway, a Job's status as Kubernetes reports
  it, and a rendered Job's reporter as its pod runs it.
- `ENDINGS`: each named constructor of `outcome.py` and the status and failure kind it records,
  each a move the store accepts; `PATHS`: every place the controller ends an attempt, each held
  to its row (a Job deleted under the Kubernetes launcher: `test_kube.py`, which needs a cluster).
- No controller module but `outcome.py` builds an `Outcome` itself.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pytest

from agl.client import GatewayClient
from agl.store import Store
from agl.types import FailureKind, Rollout, Status
from controller import outcome
from controller.launcher import Credentials, LocalLauncher
from controller.loop import Controller
from controller.manifests import job_outcome, reporter_program
from controller.outcome import (
    RAN,
    Outcome,
    across_restart,
    exited,
    retry_or_end,
    rewarded,
)
from controller.spec import parse_spec
from tests.controller.conftest import controller, reasons, script, settings, wait_status
from tests.gateway.stack import ADMIN, Stack


@dataclass(frozen=True)
class Case:
    """An attempt's end: the harness's exit code (None: it left none), the grader's if `graded`
    (None: it left none), the final reward (None: none was posted), and the status it must get."""

    harness: int | None
    status: Status
    kind: FailureKind | None
    graded: bool = False
    grader: int | None = 0
    reward: float | None = 1.0


TASK = FailureKind.TASK
INFRA = FailureKind.INFRA
CASES = [
    Case(harness=0, status=Status.SUCCEEDED, kind=None),
    Case(harness=0, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=1, status=Status.FAILED, kind=TASK),
    Case(harness=2, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=124, status=Status.TIMED_OUT, kind=TASK),
    Case(harness=137, reward=None, status=Status.TIMED_OUT, kind=TASK),
    Case(harness=126, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=127, status=Status.FAILED, kind=INFRA),
    Case(harness=None, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=0, graded=True, grader=0, reward=0.5, status=Status.SUCCEEDED, kind=None),
    Case(harness=0, graded=True, grader=0, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=0, graded=True, grader=1, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=0, graded=True, grader=2, reward=0.5, status=Status.FAILED, kind=INFRA),
    Case(harness=0, graded=True, grader=None, reward=None, status=Status.FAILED, kind=INFRA),
    Case(harness=2, graded=True, reward=None, status=Status.FAILED, kind=TASK),
    Case(harness=127, graded=True, reward=None, status=Status.FAILED, kind=INFRA),
]


@pytest.mark.parametrize("case", CASES)
def test_the_rule(case: Case) -> None:
    outcome = rewarded(exited(case.harness, case.grader, graded=case.graded), case.reward)
    assert (outcome.status, outcome.failure_kind) == (case.status, case.kind), outcome.reason


# A harness or grader: posts the reward it is given (REWARD) with its token, then exits EXIT, or
# with EXIT=none kills its whole process group, so that no exit code is written.
PROGRAM = """
import json, os, signal, sys, urllib.request
if os.environ.get("REWARD"):
    token = os.environ.get("AGL_GRADER_TOKEN") or os.environ["OPENAI_API_KEY"]
    url = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"] + "/reward"
    body = json.dumps({"reward": float(os.environ["REWARD"])}).encode()
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30)
if os.environ["EXIT"] == "none":
    os.killpg(0, signal.SIGKILL)
sys.exit(int(os.environ["EXIT"]))
"""


def _env(code: int | None, reward: float | None) -> dict[str, str]:
    env = {"EXIT": str(code)}
    if code is None:
        env["EXIT"] = "none"
    if reward is not None:
        env["REWARD"] = str(reward)
    return env


def _local_spec(command: list[str], case: Case) -> dict:
    """The case as a spec: the harness posts the reward, or the grader if there is one."""
    harness_reward = case.reward
    if case.graded:
        harness_reward = None
    spec: dict = {
        "harness": {"command": command, "env": _env(case.harness, harness_reward)},
        "max_attempts": 1,  # an infra failure ends the rollout, not retried
    }
    if case.graded:
        spec["grader"] = {"command": command, "env": _env(case.grader, case.reward)}
    return spec


def test_the_local_launcher_and_the_loop(gateway: Stack, tmp_path: Path) -> None:
    command = script(tmp_path, "program.py", PROGRAM)
    made = []
    for case in CASES:
        spec = _local_spec(command, case)
        made.append(gateway.rollout(grader=case.graded or None, metadata={"spec": spec})["id"])
    with controller(gateway, tmp_path, None, max_running=len(CASES)):
        done = [wait_status(gateway, rid) for rid in made]
    for case, rid, rollout in zip(CASES, made, done, strict=True):
        got = (rollout["status"], rollout["failure_kind"])
        assert got == (case.status, case.kind), (case, reasons(gateway, rid))


def _terminated(name: str, code: int) -> dict:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": "Error"}}}


def _job_and_pods(case: Case) -> tuple[dict, list[dict]]:
    """What Kubernetes reports of a plain Job (harness, then grader) that ended as `case` says:
    Complete, or Failed with a container's exit code, or with no pod left (no exit code)."""
    condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    if case.harness == 0 and (not case.graded or case.grader == 0):
        condition = {"type": "Complete", "status": "True"}
    job = {"status": {"conditions": [condition]}}
    if case.harness is None:
        return job, []
    statuses = {"containerStatuses": [_terminated("harness", case.harness)]}
    if case.graded:
        grader = []
        if case.harness == 0 and case.grader is not None:
            grader = [_terminated("grader", case.grader)]
        statuses = {
            "initContainerStatuses": [_terminated("harness", case.harness)],
            "containerStatuses": grader,
        }
    pod = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}, "status": statuses}
    return job, [pod]


@pytest.mark.parametrize("case", CASES)
def test_a_job_s_status_and_the_loop(case: Case) -> None:
    job, pods = _job_and_pods(case)
    found = job_outcome(job, pods)
    assert found is not None
    outcome = rewarded(found, case.reward)
    assert (outcome.status, outcome.failure_kind) == (case.status, case.kind), outcome.reason


def test_the_reporter_of_a_rendered_job(gateway: Stack, tmp_path: Path) -> None:
    """The reporter as its pod runs it: `python3 -c` with the shipped program, from a folder
    where no `controller` package can be imported."""
    for i, case in enumerate(CASES):
        made = gateway.rollout(grader=case.graded or None)
        token = made["grader_token"] if case.graded else made["agent_token"]
        if case.reward is not None:
            auth = {"Authorization": f"Bearer {token}"}
            reward = {"reward": case.reward}
            posted = gateway.admin.post(
                f"/api/rollouts/{made['id']}/reward", json=reward, headers=auth
            )
            posted.raise_for_status()
        ws = tmp_path / str(i)
        ws.mkdir()
        if case.harness is not None:
            (ws / ".agl-harness").write_text(f"{case.harness}\n")
        if case.graded and case.harness == 0 and case.grader is not None:
            (ws / ".agl-grader").write_text(f"{case.grader}\n")
        env = {
            "PATH": os.environ["PATH"],
            "AGL_GATEWAY_URL": gateway.url,
            "AGL_ROLLOUT_ID": made["id"],
            "AGL_ATTEMPT": "1",
            "AGL_TOKEN": token,
        }
        graded = "graded" if case.graded else "ungraded"
        # -I -S: no site-packages, no working directory on the path: the standard library only.
        argv = [sys.executable, "-I", "-S", "-c", reporter_program(), str(ws), graded]
        assert subprocess.run(argv, env=env, cwd=ws, timeout=60).returncode == 0
        done = gateway.admin.get(f"/api/rollouts/{made['id']}").json()
        assert (done["status"], done["failure_kind"]) == (case.status, case.kind), case


# ------------------------------------------------------------------------------ the named endings


@dataclass(frozen=True)
class Ending:
    """A named constructor of `controller/outcome.py` (`make`, given a reason) and what the
    controller records for it."""

    make: Callable[[str], Outcome]
    status: Status
    kind: FailureKind | None


RESTARTED = "; the gateway restarted during the run"
ENDINGS = {
    "ran": Ending(make=lambda reason: RAN, status=Status.SUCCEEDED, kind=None),
    "failed": Ending(make=Outcome.failed, status=Status.FAILED, kind=TASK),
    "timed_out": Ending(make=Outcome.timed_out, status=Status.TIMED_OUT, kind=TASK),
    "launch_failed": Ending(make=Outcome.launch_failed, status=Status.FAILED, kind=INFRA),
    "launch_failed, the spec's fault": Ending(
        make=partial(Outcome.launch_failed, permanent=True), status=Status.FAILED, kind=TASK
    ),
    "grader_failed": Ending(make=Outcome.grader_failed, status=Status.FAILED, kind=INFRA),
    "lost": Ending(make=Outcome.lost, status=Status.FAILED, kind=INFRA),
    "stopped": Ending(make=Outcome.stopped, status=Status.FAILED, kind=INFRA),
    "across_restart": Ending(
        make=lambda reason: across_restart(Outcome.failed(reason.removesuffix(RESTARTED))),
        status=Status.FAILED,
        kind=INFRA,
    ),
    "retry_or_end, retried": Ending(
        make=lambda reason: retry_or_end(Outcome.lost(reason), attempts_left=True),
        status=Status.QUEUED,
        kind=INFRA,
    ),
}


def test_the_table_names_every_constructor_and_the_store_accepts_each_row(tmp_path: Path) -> None:
    """`exited` and `rewarded` return the other constructors' outcomes (`CASES`); `RAN` is a
    constant; `retry_or_end` with no attempt left returns the outcome it is given."""
    constructors = {name for name, _ in inspect.getmembers(Outcome, inspect.ismethod)}
    functions = {
        name
        for name, function in inspect.getmembers(outcome, inspect.isfunction)
        if function.__module__ == outcome.__name__
    }
    named = {name.split(",")[0] for name in ENDINGS} - {"ran"}
    assert constructors | functions == named | {"exited", "rewarded"}
    with Store(f"sqlite:///{tmp_path / 'agl.db'}") as store:
        for name, ending in ENDINGS.items():
            made = ending.make("why")
            assert (made.status, made.failure_kind) == (ending.status, ending.kind), name
            rid = store.create_rollout({}, "g").result().rollout.id
            store.transition(rid, Status.RUNNING).result()
            moved = store.transition(rid, ending.status, failure_kind=ending.kind).result()
            assert moved.status is ending.status, name
            if ending.status is not Status.QUEUED:  # a retry starts its next attempt afresh
                assert moved.failure_kind == ending.kind, name


def test_no_controller_module_but_outcome_builds_an_outcome() -> None:
    """Every end goes through a named constructor: `Outcome(...)` is called only in `outcome.py`."""
    for path in Path(outcome.__file__).parent.glob("*.py"):
        if path.name == "outcome.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "Outcome", f"{path.name}:{node.lineno}"


@dataclass
class Here:
    """What a path runs against: a folder, a real gateway and a client of it."""

    tmp_path: Path
    gateway: Stack
    gw: GatewayClient

    def controller(self, spec: dict) -> Controller:
        """A controller with a real local launcher (its loop is not run: a path calls a step)."""
        launcher = LocalLauncher(self.tmp_path / "state")
        return Controller(
            self.gw, launcher, parse_spec(spec), settings(self.gateway, self.tmp_path)
        )

    async def queued(self) -> Rollout:
        """A new rollout, waiting for a launch."""
        return await self.gw.get_rollout((await self.gw.create_rollout({}, "g"))["id"])

    async def running(self) -> Rollout:
        """A rollout its harness has started."""
        return await self.gw.set_status((await self.queued()).id, Status.RUNNING, attempt=1)

    async def started(self, spec: dict) -> Outcome:
        """What the controller records when it starts a new rollout with `spec` and that fails."""
        rollout = await self.queued()
        await self.controller(spec).start(rollout)
        return await self.recorded(rollout.id)

    async def recorded(self, rollout_id: str) -> Outcome:
        """The rollout's last status move, as the controller asked for it."""
        moves = [e["data"] for e in await self.gw.events(rollout_id) if e["kind"] == "lifecycle"]
        last = moves[-1]
        return Outcome(
            status=last["to"], failure_kind=last.get("failure_kind"), reason=last.get("reason", "")
        )


@dataclass(frozen=True)
class Way:
    """A path in the controller that ends an attempt, and the row of `ENDINGS` it must be."""

    ending: str
    run: Callable[[Here], Awaitable[Outcome]]


PATHS: list[Way] = []


def path(ending: str) -> Callable:
    """Add the decorated path to `PATHS`, held to `ending`."""

    def add(run: Callable[[Here], Awaitable[Outcome]]) -> Callable:
        PATHS.append(Way(ending=ending, run=run))
        return run

    return add


def _job(condition: str | None, reason: str = "", pods: list[dict] | None = None) -> Outcome:
    """How `manifests.job_outcome` reads a Job with `condition` (None: running) and its pods."""
    conditions = []
    if condition:
        conditions = [{"type": condition, "status": "True", "reason": reason}]
    found = job_outcome({"status": {"conditions": conditions}}, pods or [])
    assert found is not None
    return found


def _pod(*containers: dict, init: tuple[dict, ...] = (), **status: str) -> dict:
    statuses = {"containerStatuses": list(containers), "initContainerStatuses": list(init)}
    return {"metadata": {}, "status": statuses | status}


@path("ran")
async def a_job_that_completed(here: Here) -> Outcome:
    return _job("Complete")


@path("timed_out")
async def a_job_past_its_active_deadline(here: Here) -> Outcome:
    return _job("Failed", "DeadlineExceeded")


@path("lost")
async def a_failed_job_with_no_pod_left(here: Here) -> Outcome:
    return _job("Failed", "BackoffLimitExceeded")


@path("lost")
async def a_job_whose_pod_was_evicted(here: Here) -> Outcome:
    return _job("Failed", "BackoffLimitExceeded", [_pod(reason="Evicted")])


@path("launch_failed")
async def a_job_whose_image_cannot_be_pulled(here: Here) -> Outcome:
    waiting = {"name": "harness", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
    return _job(None, pods=[_pod(waiting)])


@path("launch_failed")
async def a_job_whose_harness_cannot_start(here: Here) -> Outcome:
    start_error = {"exitCode": 128, "reason": "StartError"}
    return _job("Failed", pods=[_pod({"name": "harness", "state": {"terminated": start_error}})])


@path("failed")
async def a_job_whose_harness_failed(here: Here) -> Outcome:
    return _job("Failed", pods=[_pod(_terminated("harness", 3))])


@path("grader_failed")
async def a_job_whose_grader_failed(here: Here) -> Outcome:
    return _job("Failed", pods=[_pod(_terminated("grader", 1), init=(_terminated("harness", 0),))])


@path("lost")
async def a_rendered_job_whose_reporter_failed(here: Here) -> Outcome:
    return _job("Failed", pods=[_pod(_terminated("report", 1))])


@path("failed")
async def a_run_that_ended_without_a_final_reward(here: Here) -> Outcome:
    return rewarded(RAN, None)


async def _local(here: Here, rollout_id: str, spec: dict, *, stop: bool = False) -> Outcome:
    """A real local run of `spec`, polled until it ends (stopped first, with `stop`)."""
    launcher = LocalLauncher(here.tmp_path / "state")
    creds = Credentials(
        rollout_id=rollout_id,
        attempt=1,
        task={},
        gateway_url=here.gateway.url,
        base_url=f"{here.gateway.url}/v1",
        agent_token="agent",
        grader_token="grader",
    )
    await launcher.launch(parse_spec(spec), creds)
    if stop:
        await launcher.stop(creds.key)
    deadline = time.monotonic() + 30
    ended: dict = {}
    while not ended:
        assert time.monotonic() < deadline, f"{rollout_id} never ended"
        await asyncio.sleep(0.05)
        ended = dict(await launcher.poll())
    await launcher.release(creds.key)
    return ended[creds.key]


SLEEP = ["sleep", "30"]


@path("timed_out")
async def a_local_run_killed_at_its_deadline(here: Here) -> Outcome:
    return await _local(here, "deadline", {"harness": {"command": SLEEP, "timeout_s": 0.2}})


@path("launch_failed")
async def a_local_grader_that_cannot_start(here: Here) -> Outcome:
    spec = {"harness": {"command": ["true"]}, "grader": {"command": ["no-such-grader"]}}
    return await _local(here, "grader", spec)


@path("stopped")
async def a_local_run_stopped_because_its_rollout_ended(here: Here) -> Outcome:
    return await _local(here, "stopped", {"harness": {"command": SLEEP}}, stop=True)


@path("lost")
async def a_local_run_that_vanished_whole(here: Here) -> Outcome:
    return await _local(here, "vanished", {"harness": {"command": ["sh", "-c", "kill -9 0"]}})


@path("launch_failed, the spec's fault")
async def a_spec_with_a_grader_for_a_rollout_without_a_grader_token(here: Here) -> Outcome:
    return await here.started({"harness": {"command": SLEEP}, "grader": {"command": SLEEP}})


@path("retry_or_end, retried")
async def a_launch_error_with_an_attempt_left(here: Here) -> Outcome:
    return await here.started({"harness": {"command": ["no-such-harness"]}, "max_attempts": 2})


@path("launch_failed")
async def a_launch_error_with_no_attempt_left(here: Here) -> Outcome:
    return await here.started({"harness": {"command": ["no-such-harness"]}, "max_attempts": 1})


@path("lost")
async def a_run_not_found_when_the_controller_starts(here: Here) -> Outcome:
    rollout = await here.running()
    await here.gw.post_event(rollout.id, "launch", {"launcher": "local", "where": "pid 1"})
    await here.controller({"harness": {"command": SLEEP}, "max_attempts": 1}).adopt()
    return await here.recorded(rollout.id)


@path("across_restart")
async def a_task_failure_across_a_gateway_restart(here: Here) -> Outcome:
    """The rollout started before the gateway did (on its clock), as after a restart."""
    rollout = replace(await here.running(), started_at=1.0)
    ctl = here.controller({"harness": {"command": SLEEP}, "max_attempts": 1})
    await ctl.report(rollout, Outcome.failed("harness exited with 1"), ctl.spec)
    return await here.recorded(rollout.id)


def test_every_path_that_ends_an_attempt_is_a_row_of_the_table(
    gateway: Stack, tmp_path: Path
) -> None:
    async def run() -> list[str]:
        wrong = []
        async with GatewayClient(gateway.url, ADMIN) as gw:
            here = Here(tmp_path=tmp_path, gateway=gateway, gw=gw)
            for way in PATHS:
                found = await way.run(here)
                if found != ENDINGS[way.ending].make(found.reason):
                    wrong.append(f"{way.run.__name__}: {found}, not {way.ending}")
        return wrong

    assert asyncio.run(run()) == []
    assert {way.ending for way in PATHS} == set(ENDINGS)
