"""`make demo`: train an agent on the CPU through its unchanged harness, end to end.

- Starts the embedded engine (SmolLM2-135M-Instruct), the gateway (SQLite store) and the
  controller (local processes) as real processes on 127.0.0.1.
- Runs `agl train` on examples/calculator/train.yaml: collocated async RL of the calculator agent
  (a multi-call harness written with the plain openai SDK; `--harness` trains another agent on
  the same tasks, such as examples/splitting/harness.py). Each step pauses the gateway, puts the
  engine to sleep, trains on the finished groups, loads the new weights into the engine and
  resumes.
- Prints a line per step (reward, entropy, KL, grad norm) and per validation round, and at the
  end the greedy validation reward on held-out tasks before and after training, the first-3 vs
  last-3 step training reward, and where the curves (PNG), TensorBoard logs and checkpoints are;
  the figures also go to `summary.json` in the output folder.
- The console shows only those lines. Everything else the trainer prints (Ray's worker lines,
  torch's warnings, progress bars) goes to `train.log` in the output folder, beside the engine's,
  gateway's and controller's logs; the first lines printed say where. If training fails, the end
  of its log is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import reward_curve  # examples/reward_curve.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "demo-admin-key"
VAL = (ROOT / "examples" / "calculator" / "val.jsonl").read_text().splitlines()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(name: str, argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
    log = (logs / f"{name}.log").open("wb")
    command = [sys.executable, "-m", "agl.cli", *argv]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


# The trainer's own lines (trainer/metrics.py's Progress): a step's figures and a validation round's reward.
SHOWN = ("step ", "validation at step ")
TAIL_ON_FAILURE = 40  # lines of train.log printed when training fails


def train_quietly(command: list[str], log_path: Path) -> int:
    """Run `agl train`, its whole output to `log_path` and its step and validation lines to the
    console; on failure, the log's last lines too. Its exit code."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            # a progress bar redraws itself with carriage returns on the same line
            text = line.rsplit("\r", 1)[-1]
            if text.startswith(SHOWN):
                print(text, end="", flush=True)
        code = proc.wait()
    if code != 0:
        tail = log_path.read_text().splitlines()[-TAIL_ON_FAILURE:]
        print(f"agl train exited with {code}; the end of {log_path}:", *tail, sep="\n")
    return code


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


def summary(metrics: Path) -> dict[str, float]:
    """Validation reward before and after training, and the first-3 and last-3 steps' training reward."""
    history = [json.loads(line) for line in metrics.read_text().splitlines()]
    rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
    val = [h["val/reward_mean"] for h in history if "val/reward_mean" in h]
    return {
        "val_before": val[0] if val else float("nan"),
        "val_after": val[-1] if val else float("nan"),
        "train_first3": sum(rewards[:3]) / max(len(rewards[:3]), 1),
        "train_last3": sum(rewards[-3:]) / max(len(rewards[-3:]), 1),
        "steps": len(rewards),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default="smollm2", help="engine model: smollm2 (default), tiny, or a folder"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "runs" / "demo", help="store, logs, checkpoints"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--harness",
        type=Path,
        default=ROOT / "examples" / "calculator" / "harness.py",
        help="the agent to train",
    )
    parser.add_argument(
        "overrides", nargs="*", help="passed to agl train, e.g. trainer.total_training_steps=4"
    )
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
        print(f"logs: {out}/{{engine,gateway,controller,train}}.log")
        print(
            f"starting the embedded engine ({args.model}; the first run converts the model, "
            "about a minute)"
        )
        # 1 thread: batching is the speed
        engine = ["engine", "--model", args.model, "--port", str(engine_port)]
        procs.append(start("engine", engine, out))
        wait_up(engine_url + "/health", procs[-1], "the engine")
        gateway = ["gateway", "--engine-url", engine_url, "--port", str(gateway_port)]
        gateway += ["--admin-key", ADMIN_KEY, "--db", f"sqlite:///{db}"]
        procs.append(start("gateway", gateway, out))
        wait_up(gateway_url + "/healthz", procs[-1], "the gateway")
        controller = ["controller", "--gateway", gateway_url, "--admin-key", ADMIN_KEY]
        controller += ["--launcher", "local", "--state-dir", str(out / "controller")]
        procs.append(start("controller", controller, out))
        print(f"engine {engine_url}, gateway {gateway_url}, store {db}")

        calculator = ROOT / "examples" / "calculator"
        train = [
            *[sys.executable, "-m", "agl.cli", "train", str(calculator / "train.yaml")],
            *[f"agl.gateway={gateway_url}", f"agl.engine={engine_url}"],
            f"agl.admin_key={ADMIN_KEY}",
            f"agl.spec.harness.command=[{sys.executable},{args.harness.resolve()}]",
            f"agl.tasks={calculator / 'tasks.jsonl'}",
            f"agl.val_tasks={calculator / 'val.jsonl'}",
            *[f"agl.seed={args.seed}", f"trainer.default_local_dir={out / 'train'}"],
            "trainer.resume_mode=disable",
            *args.overrides,
        ]
        print("running:", " ".join(train[2:]))
        if train_quietly(train, out / "train.log") != 0:
            return 1
        result = summary(out / "train" / "metrics.jsonl") | {"wall_s": time.monotonic() - started}
        (out / "summary.json").write_text(json.dumps(result))
        curve = reward_curve.plot(out / "train")
        print(f"reward curve: {curve}; TensorBoard: {out / 'train' / 'tensorboard'}")
        print(
            f"validation reward (greedy, {len(VAL)} held-out tasks): "
            f"before training {result['val_before']:.3f}, after {result['val_after']:.3f}; "
            f"training reward: first 3 steps {result['train_first3']:.3f}, "
            f"last 3 steps {result['train_last3']:.3f} "
            f"({result['steps']} steps, {result['wall_s']:.0f} s)"
        )
        return 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
