"""The local launcher, end to end through the loop: real gateway, real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.controller.conftest import GRADER, controller, harness_spec, reasons, script, wait_status
from tests.gateway.stack import ADMIN


def test_success_env_and_logs(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout(task={"q": "what"})["id"]
    with controller(gateway, tmp_path, harness_spec(tmp_path, env={"EXTRA": "yes"})):
        done = wait_status(gateway, rid)
    assert done["status"] == "succeeded" and done["reward"] == 1.0, reasons(gateway, rid)
    env = json.loads((tmp_path / "harness.1.env").read_text())
    assert (
        env["OPENAI_BASE_URL"] == gateway.url + "/v1" and env["ANTHROPIC_BASE_URL"] == gateway.url
    )
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] and env["AGL_ROLLOUT_ID"] == rid
    assert json.loads(env["AGL_TASK"]) == {"q": "what"} and env["AGL_GATEWAY_URL"] == gateway.url
    assert env["EXTRA"] == "yes" and "AGL_GRADER_TOKEN" not in env and ADMIN not in json.dumps(env)
    calls = gateway.admin.get(f"/api/rollouts/{rid}/calls").json()
    assert len(calls) == 1 and calls[0]["attempt"] == 1
    log = tmp_path / "state" / "logs" / rid / "1" / "harness.log"
    assert "harness says hello" in log.read_text()
    assert not list((tmp_path / "state" / "runs").glob("*.json"))  # released once recorded
    # the attempt's token died with the rollout
    reply = gateway.admin.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}
    )
    assert reply.status_code == 403


def test_a_relative_state_dir_works_from_every_run_s_own_folder(
    gateway, tmp_path: Path, monkeypatch
) -> None:
    """`agl controller --state-dir runs/x` (and the default, `agl-controller`): each run starts in its own
    workspace, and still writes its exit code where the controller reads it."""
    from controller.launcher import LocalLauncher

    monkeypatch.chdir(tmp_path)
    rid = gateway.rollout()["id"]
    runner = LocalLauncher("relative")
    with controller(gateway, tmp_path, harness_spec(tmp_path), runner=runner):
        done = wait_status(gateway, rid)
    assert done["status"] == "succeeded", reasons(gateway, rid)
    assert (tmp_path / "relative" / "logs" / rid / "1" / "harness.log").is_file()


def test_nonzero_exit_is_a_task_failure(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout()["id"]
    with controller(gateway, tmp_path, harness_spec(tmp_path, env={"HARNESS_EXIT": "3"})):
        done = wait_status(gateway, rid)
    assert (done["status"], done["failure_kind"], done["attempt"]) == ("failed", "task", 1)
    assert any("harness exited with 3" in r for r in reasons(gateway, rid))


def test_no_reward_is_a_task_failure(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout()["id"]
    with controller(gateway, tmp_path, {"harness": {"command": ["true"]}}):
        done = wait_status(gateway, rid)
    assert (done["status"], done["failure_kind"]) == ("failed", "task")
    assert any("without a final reward" in r for r in reasons(gateway, rid))


def test_timeout_kills_the_process_group(gateway, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    harness = f"""
import subprocess, time
child = subprocess.Popen(["sleep", "300"])
open({str(pidfile)!r}, "w").write(str(child.pid))
time.sleep(300)
"""
    rid = gateway.rollout()["id"]
    spec = {"harness": {"command": script(tmp_path, "slow.py", harness), "timeout_s": 1.5}}
    started = time.monotonic()
    with controller(gateway, tmp_path, spec):
        done = wait_status(gateway, rid)
    assert (done["status"], done["failure_kind"]) == ("timed_out", "task")
    assert time.monotonic() - started < 20
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the grandchild survived the timeout"
        time.sleep(0.05)


def test_a_cancelled_rollout_s_run_is_stopped_even_when_no_controller_ran(
    gateway, tmp_path: Path
) -> None:
    """Cancelled while its controller runs, or while none does (the next one adopts the run and stops it):
    the run's whole process group is gone within seconds, long before its timeout."""
    harness = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[1] + "." + os.environ["AGL_ROLLOUT_ID"], "w").write(str(child.pid))
time.sleep(300)
"""
    first = gateway.rollout(task={"n": 1})["id"]
    second = gateway.rollout(task={"n": 2})["id"]
    spec = {
        "harness": {
            "command": [*script(tmp_path, "slow.py", harness), str(tmp_path / "pid")],
            "timeout_s": 300,
        }
    }

    def cancel(rid: str) -> None:
        gateway.admin.post(
            f"/api/rollouts/{rid}/status", json={"status": "cancelled"}
        ).raise_for_status()

    def wait_stopped(rid: str) -> None:
        grandchild = int((tmp_path / f"pid.{rid}").read_text())
        deadline = time.monotonic() + 10
        while _alive(grandchild):
            assert time.monotonic() < deadline, (
                f"the cancelled rollout's run is still alive: {reasons(gateway, rid)}"
            )
            time.sleep(0.05)

    with controller(gateway, tmp_path, spec, max_running=2) as running:
        for rid in (first, second):
            _wait_file(tmp_path / f"pid.{rid}")
        cancel(first)
        wait_stopped(first)
        deadline = time.monotonic() + 10
        while running.launcher.active() != 1:  # the stopped run was recorded and released
            assert time.monotonic() < deadline, running.launcher.active()
            time.sleep(0.05)
    cancel(second)  # no controller runs
    time.sleep(1)
    assert _alive(int((tmp_path / f"pid.{second}").read_text()))  # nothing stopped it yet
    with controller(gateway, tmp_path, spec, max_running=2):
        wait_stopped(second)
    assert [wait_status(gateway, rid)["status"] for rid in (first, second)] == [
        "cancelled",
        "cancelled",
    ]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_grader_runs_after_the_harness_with_its_own_token(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout(grader=True)["id"]
    spec = harness_spec(tmp_path)
    spec["grader"] = {
        "command": script(tmp_path, "grader.py", GRADER),
        "env": {"GRADER_OUT": str(tmp_path / "g")},
    }
    with controller(gateway, tmp_path, spec):
        done = wait_status(gateway, rid)
    assert done["status"] == "succeeded" and done["reward"] == 0.5, reasons(gateway, rid)
    harness_env = json.loads((tmp_path / "harness.1.env").read_text())
    grader_env = json.loads((tmp_path / "g").read_text())
    assert "AGL_GRADER_TOKEN" not in harness_env and grader_env["AGL_GRADER_TOKEN"]
    assert "OPENAI_API_KEY" not in grader_env and grader_env["AGL_GRADER_TOKEN"] not in json.dumps(
        harness_env
    )
    # The agent token may not grade itself.
    assert (tmp_path / "harness.1.reward").read_text() == "403"
    events = gateway.admin.get(f"/api/rollouts/{rid}/events").json()
    assert [e["data"].get("source") for e in events if e["kind"] == "reward"] == ["grader"]


def test_harness_failure_skips_the_grader(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout(grader=True)["id"]
    spec = harness_spec(tmp_path, env={"HARNESS_EXIT": "1"})
    spec["grader"] = {
        "command": script(tmp_path, "grader.py", GRADER),
        "env": {"GRADER_OUT": str(tmp_path / "g")},
    }
    with controller(gateway, tmp_path, spec):
        done = wait_status(gateway, rid)
    assert (done["status"], done["failure_kind"]) == ("failed", "task")
    assert not (tmp_path / "g").exists()


def test_launch_error_is_retried_then_fails_as_infra(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout()["id"]
    spec = {
        "harness": {"command": ["no-such-harness-binary"]},
        "max_attempts": 2,
        "retry_backoff_s": 0.1,
    }
    with controller(gateway, tmp_path, spec):
        done = wait_status(gateway, rid)
    assert (done["status"], done["failure_kind"], done["attempt"]) == ("failed", "infra", 2)
    assert any("no-such-harness-binary" in r for r in reasons(gateway, rid))


def test_lost_process_is_retried_and_only_the_last_attempt_counts(gateway, tmp_path: Path) -> None:
    rid = gateway.rollout()["id"]
    spec = harness_spec(tmp_path, env={"HARNESS_SLEEP_1": "300"})
    spec["retry_backoff_s"] = 0.1
    with controller(gateway, tmp_path, spec) as ctl:
        _wait_file(tmp_path / "harness.1.called")
        run = ctl.launcher.runs[(rid, 1)]  # type: ignore[attr-defined]
        # The whole run vanishes, as in an OOM kill of its cgroup.
        os.killpg(run.pid, signal.SIGKILL)
        done = wait_status(gateway, rid)
    assert (done["status"], done["attempt"], done["reward"]) == ("succeeded", 2, 1.0), reasons(
        gateway, rid
    )
    assert any("lost" in r for r in reasons(gateway, rid))
    assert [c["attempt"] for c in gateway.admin.get(f"/api/rollouts/{rid}/calls").json()] == [2]
    every = gateway.admin.get(f"/api/rollouts/{rid}/calls", params={"all_attempts": "true"}).json()
    assert sorted(c["attempt"] for c in every) == [1, 2]
    env1 = json.loads((tmp_path / "harness.1.env").read_text())
    env2 = json.loads((tmp_path / "harness.2.env").read_text())
    assert env1["OPENAI_API_KEY"] != env2["OPENAI_API_KEY"]  # fresh tokens per attempt


def _wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_restart_adopts_running_processes_and_fails_lost_ones(gateway, tmp_path: Path) -> None:
    alive = gateway.rollout(task={"n": 1})["id"]
    lost = gateway.rollout(task={"n": 2})["id"]
    spec = harness_spec(tmp_path, env={"HARNESS_SLEEP_1": "4"})
    spec["retry_backoff_s"] = 0.1
    with controller(gateway, tmp_path, spec, max_running=2) as first:
        _wait_file(tmp_path / "harness.1.called")
        wait_status(gateway, alive, {"running"})
        wait_status(gateway, lost, {"running"})
        runs = dict(first.launcher.runs)  # type: ignore[attr-defined]
    # the first controller is gone; its runs are not. One of them dies while nobody watches.
    os.killpg(runs[(lost, 1)].pid, signal.SIGKILL)
    pid_alive = runs[(alive, 1)].pid
    assert _alive(pid_alive)
    with controller(gateway, tmp_path, spec, max_running=2):
        done_alive = wait_status(gateway, alive)
        done_lost = wait_status(gateway, lost)
    assert (done_alive["status"], done_alive["attempt"]) == ("succeeded", 1), reasons(
        gateway, alive
    )
    assert (done_lost["status"], done_lost["attempt"]) == ("succeeded", 2), reasons(gateway, lost)
    assert any("lost" in r for r in reasons(gateway, lost))


def test_the_kubernetes_launcher_with_no_cluster_says_in_one_line_what_to_set(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "AGL_CONTROLLER_ADMIN_KEY": ADMIN}
    env.pop("KUBERNETES_SERVICE_HOST", None)  # not in a pod
    argv = [
        sys.executable,
        "-m",
        "agl.cli",
        "controller",
        "--launcher",
        "kubernetes",
        "--gateway",
        "http://127.0.0.1:9",
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert (
        done.stderr.startswith("agl controller: error: no Kubernetes cluster")
        and "KUBECONFIG" in done.stderr
    )
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback


def test_a_restart_finds_its_lost_runs_by_their_launch_event_not_by_a_reason(
    gateway, tmp_path: Path
) -> None:
    """A run gone with its state file while no controller ran is found by the `launch` event that
    names this launcher: an infra failure, retried. A rollout someone else marked running is left
    alone, whatever its reason says."""
    ours = gateway.rollout(task={"n": 1})["id"]
    spec = harness_spec(tmp_path, env={"HARNESS_SLEEP_1": "300"})
    spec["retry_backoff_s"] = 0.1
    with controller(gateway, tmp_path, spec) as first:
        _wait_file(tmp_path / "harness.1.called")
        run = first.launcher.runs[(ours, 1)]  # type: ignore[attr-defined]
    events = gateway.admin.get(f"/api/rollouts/{ours}/events").json()
    launches = [e["data"] for e in events if e["kind"] == "launch"]
    assert launches == [{"launcher": "local", "where": f"pid {run.pid}"}]
    os.killpg(run.pid, signal.SIGKILL)
    for state in (tmp_path / "state" / "runs").glob("*.json"):
        state.unlink()
    theirs = gateway.rollout(task={"n": 2})["id"]
    moved = {"status": "running", "reason": "launched by local: pid 1"}
    gateway.admin.post(f"/api/rollouts/{theirs}/status", json=moved).raise_for_status()
    with controller(gateway, tmp_path, spec):
        done = wait_status(gateway, ours)
    assert (done["status"], done["attempt"]) == ("succeeded", 2), reasons(gateway, ours)
    assert any("not found when the controller started" in r for r in reasons(gateway, ours))
    left = gateway.admin.get(f"/api/rollouts/{theirs}").json()
    assert (left["status"], left["attempt"]) == ("running", 1), reasons(gateway, theirs)
