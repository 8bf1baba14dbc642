"""Controller: local rollouts launched per second, and the controller's memory with 500 running.

A real gateway (over an instant engine stand-in, see bench/gateway.py) and `agl controller`
with the local launcher, each its own process. First `--launches` rollouts whose harness exits
at once (`true`): launches/s is their number over the time from the first launch to the last
recorded end (each one: fresh tokens, spawn, status, event, exit, reward check, final status).
The baseline, in the same run, is spawning and reaping `sh -c true` directly. Then 500 rollouts
whose harness is `sleep`, all running at once, for the controller's peak RSS. Last line:
`controller_launch_per_s=A controller_rss_mb_500=B`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.gateway import ADMIN, free_port, rss_mb, wait
from bench.quick import parse_args

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--running", type=int, default=500)
    args = parse_args(parser, launches=20, running=20)

    from engine import models

    cache_dir = Path(os.environ.get("AGL_ENGINE_CACHE_DIR", "~/.cache/agl/models")).expanduser()
    tokenizer = str(models.resolve("tiny", cache_dir))
    engine_port, gateway_port = free_port(), free_port()
    engine, gateway = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
    env = os.environ | {"OMP_NUM_THREADS": "1", "AGL_LOG_LEVEL": "WARNING"}
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        stand_in = [py, "-m", "bench.gateway", "--stand-in", str(engine_port)]
        procs = [subprocess.Popen([*stand_in, "--tokenizer", tokenizer])]
        try:
            wait(engine + "/model_info")
            gw = [py, "-m", "agl.cli", "gateway", "--engine-url", engine]
            gw += ["--port", str(gateway_port), "--admin-key", ADMIN]
            gw += ["--db", f"sqlite:///{tmp}/bench.db"]
            procs.append(subprocess.Popen(gw, env=env))
            wait(gateway + "/healthz")
            create(gateway, args.launches, "quick", {"harness": {"command": ["true"]}})
            ctl = [py, "-m", "agl.cli", "controller", "--gateway", gateway, "--admin-key", ADMIN]
            ctl += ["--state-dir", tmp, "--max-running", str(args.running + 100)]
            ctl += ["--launch-per-s", "100000", "--poll-s", "0.05"]
            controller = subprocess.Popen(
                ctl, env=env | {"AGL_LOG_LEVEL": "WARNING"}, stderr=subprocess.DEVNULL
            )
            procs.append(controller)
            while count(gateway, "queued") == args.launches:
                time.sleep(0.01)
            t0 = time.perf_counter()
            while count(gateway, "failed") + count(gateway, "succeeded") < args.launches:
                time.sleep(0.05)
            launch_per_s = args.launches / (time.perf_counter() - t0)
            direct_per_s = baseline(args.launches)

            create(gateway, args.running, "sleepers", {"harness": {"command": ["sleep", "600"]}})
            deadline = time.monotonic() + 300
            while count(gateway, "running") < args.running and time.monotonic() < deadline:
                time.sleep(0.2)
            running = count(gateway, "running")
            time.sleep(2)  # a few reconcile rounds with all of them running
            peak = rss_mb(controller.pid)
        finally:
            for p in reversed(procs):
                p.send_signal(signal.SIGTERM)
                p.wait()
            # the controller leaves runs alive, by design
            for state in Path(tmp, "runs").glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    os.killpg(json.loads(state.read_text())["pid"], signal.SIGKILL)
    print(
        f"launch+record, harness `true`: {launch_per_s:.0f} rollouts/s "
        f"(direct spawn: {direct_per_s:.0f}/s)"
    )
    print(f"controller RSS (peak) with {running} rollouts running: {peak:.0f} MiB")
    print(f"controller_launch_per_s={launch_per_s:.0f} controller_rss_mb_500={peak:.0f}")


if __name__ == "__main__":
    main()
