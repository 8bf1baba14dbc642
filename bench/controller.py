"""Controller: local rollouts launched per second, and the controller's memory with 500 running.

- A real gateway over an instant engine stand-in (bench/gateway.py) and `agl controller` with the
  local launcher, each its own process, started through bench/stack.py.
- First `--launches` rollouts whose harness exits at once (`true`): launches/s is their number
  over the time from the first launch to the last recorded end (each one: fresh tokens, spawn,
  status, event, exit, reward check, final status). The baseline, in the same run, is spawning
  and reaping `sh -c true` directly.
- Then `--running` rollouts whose harness is `sleep`, all running at once, for the controller's
  peak RSS; the runs it leaves alive are killed at the end.
- Last line: `controller_launch_per_s=A controller_rss_mb_500=B`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import httpx

from bench.gateway import rss_mb
from bench.quick import parse_args
from bench.stack import ADMIN, running

H = {"Authorization": f"Bearer {ADMIN}"}


def count(gateway: str, status: str) -> int:
    """Rollouts in `status`, from the gateway's metrics (one cheap query, not a listing)."""
    for line in httpx.get(gateway + "/metrics").text.splitlines():
        if line.startswith(f'agl_rollouts{{status="{status}"}}'):
            return int(float(line.split()[-1]))
    return 0


def create(gateway: str, n: int, group: str, spec: dict) -> None:
    with httpx.Client(base_url=gateway, headers=H) as client:
        for _ in range(n):
            body = {"group": group, "metadata": {"spec": spec}}
            client.post("/api/rollouts", json=body).raise_for_status()


def baseline(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        os.waitpid(os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "true"], {}), 0)
    return n / (time.perf_counter() - t0)


def kill_runs(state: Path) -> None:
    """The runs a controller left alive (by design: a restarted controller adopts them), killed."""
    for run in (state / "runs").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.killpg(json.loads(run.read_text())["pid"], signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--running", type=int, default=500)
    args = parse_args(parser, launches=20, running=20)

    with running() as stack:
        state = stack.tmp / "controller"
        try:
            create(stack.url, args.launches, "quick", {"harness": {"command": ["true"]}})
            flags = ["--max-running", str(args.running + 100)]
            flags += ["--launch-per-s", "100000", "--poll-s", "0.05"]
            stack.start_controller(state, *flags, log_level="WARNING")
            while count(stack.url, "queued") == args.launches:
                time.sleep(0.01)
            t0 = time.perf_counter()
            while count(stack.url, "failed") + count(stack.url, "succeeded") < args.launches:
                time.sleep(0.05)
            launch_per_s = args.launches / (time.perf_counter() - t0)
            direct_per_s = baseline(args.launches)

            sleep = {"harness": {"command": ["sleep", "600"]}}
            create(stack.url, args.running, "sleepers", sleep)
            deadline = time.monotonic() + 300
            while count(stack.url, "running") < args.running and time.monotonic() < deadline:
                time.sleep(0.2)
            running_now = count(stack.url, "running")
            time.sleep(2)  # a few reconcile rounds with all of them running
            peak = rss_mb(stack.pid("controller"))
        finally:
            stack.close()  # the controller first: it would launch a run killed under it again
            kill_runs(state)
    print(
        f"launch+record, harness `true`: {launch_per_s:.0f} rollouts/s "
        f"(direct spawn: {direct_per_s:.0f}/s)"
    )
    print(f"controller RSS (peak) with {running_now} rollouts running: {peak:.0f} MiB")
    print(f"controller_launch_per_s={launch_per_s:.0f} controller_rss_mb_500={peak:.0f}")


if __name__ == "__main__":
    main()
