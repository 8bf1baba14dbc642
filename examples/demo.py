"""`make demo`: the stack on its embedded defaults, and one real rollout through it end to end.

Starts the embedded engine (SmolLM2-135M-Instruct on the CPU) and the gateway (SQLite store)
as real processes on 127.0.0.1, creates a rollout, runs an unchanged harness (the calculator
agent in examples/calculator/, written with the plain openai SDK) with the injected endpoint
and credentials, records how it ended, and prints what the gateway recorded: every call's
token counts, its decoded reply, how consecutive calls extended one token sequence, the reward.

Until the controller and the trainer land, this script plays their part for one rollout; it
grows into the training demo later.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "demo-admin-key"
TASK = {"question": "What is 17 * 23 + 4?", "answer": 395}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(name: str, argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
    log = (logs / f"{name}.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "agl.cli", *argv], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see its log")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not come up in {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="engine model: smollm2 (default), tiny, or a folder")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo", help="store, logs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "agl.db"
    db.unlink(missing_ok=True)
    engine_port, gateway_port = free_port(), free_port()
    engine_url, gateway_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        print(f"starting the embedded engine ({args.model}; the first run converts the model, about a minute)")
        procs.append(start("engine", ["engine", "--model", args.model, "--port", str(engine_port)], args.out))
        wait_up(engine_url + "/health", procs[-1], "the engine")
        gateway = ["gateway", "--engine-url", engine_url, "--port", str(gateway_port), "--admin-key", ADMIN_KEY]
        procs.append(start("gateway", [*gateway, "--db", f"sqlite:///{db}"], args.out))
        wait_up(gateway_url + "/healthz", procs[-1], "the gateway")
        print(f"engine {engine_url}, gateway {gateway_url}, store {db}")

        admin = httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
        created = admin.post("/api/rollouts", json={"task": TASK, "group": "demo-task-0"}).json()
        rid = created["id"]
        env = os.environ | {
            "OPENAI_BASE_URL": created["base_url"],
            "OPENAI_API_KEY": created["agent_token"],
            "ANTHROPIC_BASE_URL": created["anthropic_base_url"],
            "ANTHROPIC_API_KEY": created["agent_token"],
            "AGL_GATEWAY_URL": gateway_url,
            "AGL_ROLLOUT_ID": rid,
            "AGL_TASK": json.dumps(TASK),
        }
        admin.post(f"/api/rollouts/{rid}/status", json={"status": "running"}).raise_for_status()
        print(f"rollout {rid}: running the calculator harness on {TASK['question']!r}")
        harness = ROOT / "examples" / "calculator" / "harness.py"
        done = subprocess.run([sys.executable, str(harness)], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            end = {"status": "succeeded"}
        else:
            end = {"status": "failed", "failure_kind": "task", "reason": f"exit {done.returncode}"}
        admin.post(f"/api/rollouts/{rid}/status", json=end).raise_for_status()

        rollout = admin.get(f"/api/rollouts/{rid}").json()
        calls = admin.get(f"/api/rollouts/{rid}/calls").json()
        print(f"harness output: {done.stdout.strip() or done.stderr.strip()[-500:]}")
        print(f"rollout {rid}: {rollout['status']}, reward {rollout['reward']}, {len(calls)} calls recorded")
        for c in calls:
            text = c["response"]["text"].replace("\n", " ")[:90]
            print(
                f"  call {c['seq']}: {len(c['prompt_ids'])} prompt + {len(c['response_ids'])} sampled tokens "
                f"({len(c['logprobs'])} logprobs, finish {c['finish_reason']}): {text!r}"
            )
        for a, b in itertools.pairwise(calls):
            whole = a["prompt_ids"] + a["response_ids"]
            kept = b["prompt_ids"][: len(whole)] == whole
            print(f"  call {b['seq']} {'extends' if kept else 'does not extend'} call {a['seq']}'s token sequence")
        metrics = admin.get("/metrics").text
        print(
            "  "
            + "\n  ".join(
                line for line in metrics.splitlines() if line.startswith(("agl_prefix_total", "agl_calls_total"))
            )
        )
        return 0 if rollout["status"] == "succeeded" and calls else 1
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
