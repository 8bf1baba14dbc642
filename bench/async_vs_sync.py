"""Collocated async vs sync RL: wall time per training step on harnesses with heavy-tailed tool time.

- The whole loop, real: the embedded engine (tiny model), the gateway and the controller (local
  launcher), each a process started through bench/stack.py, and `agl train` with the CPU backend
  in this one.
- Each harness makes `--calls` model calls and "runs a tool" between them: a lognormal sleep
  (median 1 s, sigma `--sigma`, so a long tail).
- Both modes train the same number of rollouts (`--steps` x `--batch-groups` x `--n`): sync
  launches a batch, waits for all of it, trains; async keeps `--active-groups` groups running and
  trains on the first `--batch-groups` that finish, the rest carried over (staleness bound
  `--max-staleness`, high enough that nothing is dropped).
- Prints per mode the wall time per step (first launch to last update, over the steps) and the
  staleness of the trained rollouts.
- Last line: `async_vs_sync_speedup=R max_staleness_seen=S`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

from omegaconf import OmegaConf

from bench.quick import parse_args
from bench.stack import ADMIN, ROOT, processes

TRAIN_YAML = ROOT / "examples" / "calculator" / "train.yaml"

# The stdlib only (no SDK import per process): the harness's own CPU is not what is measured.
HARNESS = """
import json, os, random, time, urllib.request
task, base = json.loads(os.environ["AGL_TASK"]), os.environ["OPENAI_BASE_URL"]
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), auth)
    return json.load(urllib.request.urlopen(req, timeout=600))
messages = [{"role": "user", "content": task["q"]}]
for _ in range(int(os.environ["BENCH_CALLS"])):
    body = {"model": "agent", "messages": messages, "max_tokens": 8}
    reply = post(base + "/chat/completions", body | {"temperature": float(os.environ["BENCH_TEMPERATURE"])})
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "tool output"}]
    time.sleep(random.lognormvariate(0.0, float(os.environ["BENCH_SIGMA"])))  # the tool
reward = float(len(messages[-2]["content"] or "") % 2)
rollout = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"]
post(rollout + "/reward", {"reward": reward})
"""


def run_mode(
    mode: str, args: argparse.Namespace, gateway: str, engine: str, work: Path
) -> tuple[float, Counter]:
    from trainer.config import load_config
    from trainer.loop import train

    harness = work / "harness.py"
    # The harness samples at the temperature the trainer computes log-probs at.
    temperature = OmegaConf.load(TRAIN_YAML).agl.temperature
    env = {
        "BENCH_CALLS": str(args.calls),
        "BENCH_SIGMA": str(args.sigma),
        "BENCH_TEMPERATURE": str(temperature),
    }
    env_override = ",".join(f"{name}:'{value}'" for name, value in env.items())
    overrides = [
        *[f"agl.gateway={gateway}", f"agl.engine={engine}", f"agl.admin_key={ADMIN}"],
        f"agl.mode={mode}",
        f"agl.spec.harness.command=[{sys.executable},{harness}]",
        f"agl.spec.harness.env={{{env_override}}}",
        *[f"agl.tasks={work / 'tasks.jsonl'}", "agl.val_tasks="],
        *[f"agl.n={args.n}", "agl.threads=1"],
        *[f"agl.batch_groups={args.batch_groups}", f"agl.active_groups={args.active_groups}"],
        "agl.poll_s=0.1",
        *[f"agl.max_staleness={args.max_staleness}", f"trainer.total_training_steps={args.steps}"],
        *[f"trainer.experiment_name=bench-{mode}", f"trainer.default_local_dir={work / mode}"],
        *["trainer.logger=[]", "trainer.save_freq=0"],
    ]
    cfg, agl = load_config(TRAIN_YAML, overrides)
    started = time.monotonic()
    history = asyncio.run(train(cfg, agl))
    wall = time.monotonic() - started
    steps = [h for h in history if "staleness/max" in h]
    staleness: Counter = Counter()
    for h in steps:
        for key, count in h.items():
            if key.startswith("staleness/count_"):
                staleness[int(key.rsplit("_", 1)[1])] += int(count)
    trained = sum(int(h["adapter/rollouts"]) for h in steps)
    per_step = wall / len(steps)
    print(
        f"{mode:>5}: {len(steps)} steps, {trained} rollouts, {per_step:.2f} s/step, "
        f"staleness {dict(staleness)}"
    )
    return per_step, staleness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--n", type=int, default=4, help="rollouts per group")
    parser.add_argument("--batch-groups", type=int, default=2)
    parser.add_argument("--active-groups", type=int, default=6, help="async: groups in flight")
    parser.add_argument("--calls", type=int, default=3, help="model calls per rollout")
    parser.add_argument(
        "--sigma", type=float, default=1.0, help="lognormal sigma of the tool time (median 1 s)"
    )
    parser.add_argument("--max-staleness", type=int, default=8)
    args = parse_args(parser, steps=3, n=2, batch_groups=1, active_groups=3, calls=2)
    with processes() as stack:
        work = stack.tmp
        (work / "harness.py").write_text(HARNESS)
        tasks = "".join(json.dumps({"q": f"task {i}"}) + "\n" for i in range(64))
        (work / "tasks.jsonl").write_text(tasks)
        stack.start_model_engine("tiny")
        stack.start_gateway()
        stack.start_controller(work / "controller")
        sync, _ = run_mode("sync", args, stack.url, stack.engine, work)
        async_, staleness = run_mode("async", args, stack.url, stack.engine, work)
    print(f"sync {sync:.2f} s/step, async {async_:.2f} s/step: {sync / async_:.2f}x (target >= 2x)")
    most_stale = max(staleness, default=0)
    print(f"async_vs_sync_speedup={sync / async_:.2f} max_staleness_seen={most_stale}")


if __name__ == "__main__":
    main()
