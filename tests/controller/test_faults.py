"""Controller faults: harnesses that crash or leave children behind, a controller killed with
SIGKILL mid-launch and restarted (real gateway, real `agl controller` processes, real harnesses)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from bench import soak
from bench.stack import running
from controller.launcher import Credentials, LocalLauncher, process_start
from controller.spec import parse_spec
from tests.controller.conftest import controller, reasons, script, wait_status

LEAVES_A_CHILD = """
import os, subprocess, sys, httpx
child = subprocess.Popen(["sleep", "300"])  # same process group; outlives this harness
open(sys.argv[1], "w").write(str(child.pid))
url = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"] + "/reward"
httpx.post(url, json={"reward": 1.0}, headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_children_that_outlive_the_harness_are_killed(gateway, tmp_path: Path, code: int) -> None:
    rid = gateway.rollout()["id"]
    pidfile = tmp_path / "child.pid"
    spec = {
        "harness": {"command": [*script(tmp_path, "h.py", LEAVES_A_CHILD), str(pidfile), str(code)]}
    }
    with controller(gateway, tmp_path, spec):
        done = wait_status(gateway, rid)
    want = ("succeeded", None) if code == 0 else ("failed", "task")
    assert (done["status"], done["failure_kind"]) == want, reasons(gateway, rid)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while process_start(child) is not None:
        assert time.monotonic() < deadline, "the harness's child outlived its run"
        time.sleep(0.05)


def test_a_launch_cut_short_right_after_the_spawn_is_found_by_the_next_controller(
    tmp_path: Path, monkeypatch
) -> None:
    """The controller dies between starting a process and recording it. SIGKILL cannot be aimed
    between two lines, so an exception raised right after the real spawn stands in for it."""
    real_spawn = os.posix_spawn
    spawned = []

    def spawn_then_die(*args, **kwargs):
        spawned.append(real_spawn(*args, **kwargs))
        raise KeyboardInterrupt

    spec = parse_spec({"harness": {"command": ["sleep", "300"]}})
    creds = Credentials(
        rollout_id="r1",
        attempt=1,
        task={},
        gateway_url="http://gw",
        base_url="http://gw/v1",
        agent_token="token",
    )
    monkeypatch.setattr(os, "posix_spawn", spawn_then_die)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(LocalLauncher(tmp_path).launch(spec, creds))
    monkeypatch.undo()
    try:
        restarted = LocalLauncher(tmp_path)
        # Not forgotten: relaunching it would run it twice.
        assert asyncio.run(restarted.adopt()) == [("r1", 1)]
        ((key, outcome),) = asyncio.run(restarted.poll())
        assert key == ("r1", 1) and outcome.failure_kind == "infra"  # so attempt 2 gets new tokens
    finally:
        for pid in spawned:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.slow
def test_controller_sigkill_mid_launch_launches_nothing_twice(tmp_path: Path) -> None:
    """`agl controller` killed twice while launching; a harness that succeeds, crashes, hangs or
    forks each ends as it should, each attempt started once, and no child outlives its run. Then
    the gateway restarts under two runs, which fail: retried as infra failures, they succeed; the
    controller restarted meanwhile started while the gateway was down, and carried on."""
    with running(tmp_path) as stack:
        out = asyncio.run(soak.controller_kill(stack, rollouts=8, kills=2, timeout_s=6))
    assert out["ended"] == out["rollouts"] == 8, out
    assert out["wrong_outcome"] == 0, out
    assert out["launched_twice"] == 0 and out["children_left"] == 0, out
    assert out["outage_retried"] == 2, out
    assert "the gateway restarted during the run" in (tmp_path / "controller.log").read_text()


def test_rollouts_that_are_someone_elses_do_not_block_the_queue(gateway, tmp_path: Path) -> None:
    """Queued rollouts without a spec (another controller's) ahead of this controller's own, more
    of them than it may run at once: its own still run."""
    for _ in range(3):
        gateway.rollout(group="theirs")
    spec = {
        "harness": {
            "command": [*script(tmp_path, "h.py", LEAVES_A_CHILD), str(tmp_path / "pid"), "0"]
        }
    }
    mine = gateway.rollout(group="mine", metadata={"spec": spec})["id"]
    with controller(gateway, tmp_path, None, max_running=2):
        assert wait_status(gateway, mine, timeout=30)["status"] == "succeeded", reasons(
            gateway, mine
        )
