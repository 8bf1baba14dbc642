"""`make demo`: train an agent on the CPU through its unchanged harness, end to end.

Starts the embedded engine (SmolLM2-135M-Instruct), the gateway (SQLite store) and the
controller (local processes) as real processes on 127.0.0.1, then runs `agl train` on
examples/calculator/train.yaml: collocated async RL of the calculator agent (a multi-call
harness written with the plain openai SDK). Each step pauses the gateway, puts the engine to
sleep, trains on the finished groups, loads the new weights into the engine and resumes.
Prints the reward per step, and at the end the first-3 vs last-3 step mean reward and where
the reward curve (PNG), TensorBoard logs and checkpoints are.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "demo-admin-key"


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
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo", help="store, logs, checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="passed to agl train, e.g. trainer.total_training_steps=4")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    db = out / "agl.db"
    shutil.rmtree(out / "train", ignore_errors=True)  # a fresh run: no checkpoint to resume
    for stale in (db, out / "agl.db-wal", out / "agl.db-shm"):
        stale.unlink(missing_ok=True)
    engine_port, gateway_port = free_port(), free_port()
    engine_url, gateway_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
    procs: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        print(f"starting the embedded engine ({args.model}; the first run converts the model, about a minute)")
        engine = ["engine", "--model", args.model, "--port", str(engine_port)]  # 1 thread: batching is the speed
        procs.append(start("engine", engine, out))
        wait_up(engine_url + "/health", procs[-1], "the engine")
        gateway = ["gateway", "--engine-url", engine_url, "--port", str(gateway_port), "--admin-key", ADMIN_KEY]
        procs.append(start("gateway", [*gateway, "--db", f"sqlite:///{db}"], out))
        wait_up(gateway_url + "/healthz", procs[-1], "the gateway")
        controller = ["controller", "--gateway", gateway_url, "--admin-key", ADMIN_KEY, "--launcher", "local"]
        procs.append(start("controller", [*controller, "--state-dir", str(out / "controller")], out))
        print(f"engine {engine_url}, gateway {gateway_url}, store {db}; logs in {out}")

        harness = ROOT / "examples" / "calculator"
        train = [
            *[sys.executable, "-m", "agl.cli", "train", str(harness / "train.yaml")],
            *[f"agl.gateway={gateway_url}", f"agl.engine={engine_url}", f"agl.admin_key={ADMIN_KEY}"],
            f"agl.spec.harness.command=[{sys.executable},{harness / 'harness.py'}]",
            *[f"agl.tasks={harness / 'tasks.jsonl'}", f"agl.val_tasks={harness / 'val.jsonl'}"],
            *[f"agl.seed={args.seed}", f"trainer.default_local_dir={out / 'train'}", "trainer.resume_mode=disable"],
            *args.overrides,
        ]
        print("running:", " ".join(train[2:]))
        if subprocess.run(train, cwd=ROOT).returncode != 0:
            return 1
        history = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
        rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
        first, last = sum(rewards[:3]) / len(rewards[:3]), sum(rewards[-3:]) / len(rewards[-3:])
        print(f"mean training reward: first 3 steps {first:.3f}, last 3 steps {last:.3f} ({len(rewards)} steps)")
        print(f"reward curve: {out / 'train' / 'reward_curve.png'}; TensorBoard: {out / 'train' / 'tensorboard'}")
        print(f"total {time.monotonic() - started:.0f} s")
        return 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
