"""`make demo`: the stack on its embedded defaults, and real rollouts through it end to end.

Starts the embedded engine (SmolLM2-135M-Instruct on the CPU), the gateway (SQLite store) and
the controller (local processes) as real processes on 127.0.0.1, creates a group of rollouts
whose spec runs an unchanged harness (the calculator agent in examples/calculator/, written
with the plain openai SDK), waits for the controller to run them to the end, and prints what
the gateway recorded: every call's token counts and decoded reply, how consecutive calls
extended one token sequence, and each rollout's status and reward.

Until the trainer lands, this is where the demo stops; it grows into the training demo later.
"""

from __future__ import annotations

import argparse
import itertools
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "demo-admin-key"
TASKS = [
    {"question": "What is 17 * 23 + 4?", "answer": 395},
    {"question": "What is 2 + 2?", "answer": 4},
    {"question": "What is 12 * 12?", "answer": 144},
    {"question": "What is 100 - 58?", "answer": 42},
]


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
    parser.add_argument("--rollouts", type=int, default=4, help="how many tasks to run (at most 4)")
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

        controller = ["controller", "--gateway", gateway_url, "--admin-key", ADMIN_KEY, "--launcher", "local"]
        procs.append(start("controller", [*controller, "--state-dir", str(args.out / "controller")], args.out))
        admin = httpx.Client(base_url=gateway_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
        harness = ROOT / "examples" / "calculator" / "harness.py"
        spec = {"harness": {"command": [sys.executable, str(harness)], "timeout_s": 300}, "max_attempts": 2}
        ids = []
        for task in TASKS[: args.rollouts]:
            body = {"task": task, "group": "demo-" + task["question"], "metadata": {"spec": spec}}
            ids.append(admin.post("/api/rollouts", json=body).json()["id"])
        print(f"{len(ids)} rollouts queued; the controller runs the calculator harness for each")
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            rollouts = [admin.get(f"/api/rollouts/{rid}").json() for rid in ids]
            if all(r["status"] in ("succeeded", "failed", "timed_out", "cancelled") for r in rollouts):
                break
            time.sleep(1)
        ok = True
        for r in rollouts:
            calls = admin.get(f"/api/rollouts/{r['id']}/calls").json()
            ok &= r["status"] in ("succeeded", "failed") and r["failure_kind"] != "infra" and bool(calls)
            question = r["task"]["question"]
            print(f"rollout {r['id'][:8]} {question!r}: {r['status']}, reward {r['reward']}, {len(calls)} calls")
            for c in calls:
                text = c["response"]["text"].replace("\n", " ")[:80]
                print(
                    f"  call {c['seq']}: {len(c['prompt_ids'])} prompt + {len(c['response_ids'])} sampled tokens "
                    f"({len(c['logprobs'])} logprobs, {c['finish_reason']}): {text!r}"
                )
            for a, b in itertools.pairwise(calls):
                whole = a["prompt_ids"] + a["response_ids"]
                kept = b["prompt_ids"][: len(whole)] == whole
                print(f"  call {b['seq']} {'extends' if kept else 'does not extend'} call {a['seq']}'s token sequence")
        metrics = admin.get("/metrics").text
        shown = [line for line in metrics.splitlines() if line.startswith(("agl_prefix_total", "agl_calls_total"))]
        print("gateway metrics:\n  " + "\n  ".join(shown))
        print(f"store: {db}; logs: {args.out}")
        return 0 if ok else 1
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
