"""The training loop end to end: gateway, controller, engine, adapter, verl's workers, push.

Everything is real and on 127.0.0.1: the embedded engine (tiny model) and the gateway as uvicorn
servers, a controller running harness processes (the openai SDK, two calls each), and the
trainer updating the tiny model on verl's workers (the GPU code path, on the CPU) and pushing
its weights back into the engine each step.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from agl.types import Mode
from tests.controller.conftest import controller, script
from tests.gateway.stack import ADMIN, Stack, sglang_stack, stack
from tests.sglang import SglangStandIn
from trainer.config import ConfigError, load_config
from trainer.loop import train

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "calculator" / "train.yaml"

# Two calls (the second extends the first), a pause after each, then a reward: the task's own
# when it has one (a group with equal rewards: nothing to learn), else 0 for the first rollout
# of its task to finish and 1 for the others, so that groups have mixed rewards.
HARNESS = """
import json, os, time, httpx
from openai import OpenAI
task = json.loads(os.environ["AGL_TASK"])
messages, text = [{"role": "user", "content": task["q"]}], ""
for _ in range(2):
    reply = OpenAI().chat.completions.create(model="agent", messages=messages, max_tokens=6, temperature=1.0)
    content = reply.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "and?"}]
    text += content
    time.sleep(float(task.get("sleep", 0)))
url = os.environ["AGL_GATEWAY_URL"] + "/api/rollouts/" + os.environ["AGL_ROLLOUT_ID"]
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
if task.get("flag"):  # as a reward-hacking check would
    flag = {"kind": "flag", "data": {"flag": "network"}}
    httpx.post(url + "/events", json=flag, headers=auth).raise_for_status()
    # an intermediate reward for the first call
    first = httpx.get(url + "/calls", headers=auth).json()[0]["seq"]
    shaped = {"reward": -1, "final": False, "call_seq": first}
    httpx.post(url + "/reward", json=shaped, headers=auth).raise_for_status()
reward = task.get("reward")
# 1 the first time this task runs, then 0: a validation that gets worse
if reward is None and task.get("once"):
    try:
        os.close(os.open(os.path.join(task["marks"], "once " + task["q"]), os.O_CREAT | os.O_EXCL))
        reward = 1.0
    except FileExistsError:
        reward = 0.0
if reward is None:
    try:
        os.close(os.open(os.path.join(task["marks"], task["q"]), os.O_CREAT | os.O_EXCL))
        reward = 0.0
    except FileExistsError:
        reward = 1.0
httpx.post(url + "/reward", json={"reward": reward}, headers=auth).raise_for_status()
"""


PINNED = {"batch_groups": 2, "active_groups": 3}  # the tests' own sizes, whatever the demo uses


def overrides(
    gw: Stack,
    tmp_path: Path,
    sleep: float,
    *extra: str,
    own_spec: bool = False,
    rewards: dict[int, float] | None = None,
    val: list[dict] | None = None,
) -> list[str]:
    """The demo's config pointed at this stack; with `own_spec`, each task entry carries its spec
    (and a flag); `rewards`: the tasks (by index) whose rollouts all get that reward; `val`:
    validation tasks (else none)."""
    command = script(tmp_path, "harness.py", HARNESS)
    (tmp_path / "marks").mkdir(exist_ok=True)
    marks = str(tmp_path / "marks")
    tasks = [{"q": f"count to {i}", "sleep": sleep, "marks": marks} for i in range(20)]
    tasks = [
        t | ({"reward": rewards[i]} if i in (rewards or {}) else {}) for i, t in enumerate(tasks)
    ]
    if own_spec:
        tasks = [
            {"task": t | {"flag": True}, "spec": {"harness": {"command": command}}} for t in tasks
        ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "val.jsonl").write_text(
        "".join(json.dumps(t | {"marks": marks}) + "\n" for t in val or [])
    )
    return [
        *gw.train_overrides(tmp_path / "run"),
        *[
            f"agl.tasks={tmp_path / 'tasks.jsonl'}",
            "agl.spec=null" if own_spec else f"agl.spec.harness.command=[{','.join(command)}]",
        ],
        f"agl.val_tasks={tmp_path / 'val.jsonl' if val else ''}",
        *["agl.n=2", "trainer.total_training_steps=3"],
        "agl.temperature=1.0",  # what HARNESS samples at
        *extra,
        *[
            f"agl.{k}={v}"
            for k, v in PINNED.items()
            if not any(e.startswith(f"agl.{k}=") for e in extra)
        ],
    ]


def run_loop(
    gw: Stack,
    tmp_path: Path,
    *extra: str,
    sleep: float = 0.0,
    own_spec: bool = False,
    full: bool = False,
    **kw: Any,
) -> list[dict]:
    """The training steps' metrics (with `full`, the whole history: validation and guard entries too)."""
    cfg, agl = load_config(DEMO, overrides(gw, tmp_path, sleep, *extra, own_spec=own_spec, **kw))
    with controller(gw, tmp_path, None):
        history = asyncio.run(train(cfg, agl))
    return history if full else [h for h in history if "reward/mean" in h]


def check_versions(gw: Stack, steps: int) -> None:
    """Each step registered a version, the engine serves the last, and the gateway serves it."""
    assert gw.engine.weight_version == str(steps)
    state = gw.admin.get("/api/state").json()
    assert (
        state["version"] == steps
        and state["latest_model"]["version"] == steps
        and not state["paused"]
    )


def test_sync_mode_runs_three_steps_and_serves_each_new_version(
    tiny_path: Path, tmp_path: Path
) -> None:
    with stack(tiny_path, tmp_path) as gw:
        mb = "actor_rollout_ref.actor.ppo_mini_batch_size=3"  # rollouts: 4 a step, in 2 optimizer steps
        steps = run_loop(
            gw,
            tmp_path,
            "agl.mode=sync",
            "agl.batch_groups=2",
            mb,
            "agl.intermediate_coef=0.5",
            own_spec=True,
        )
        check_versions(gw, 3)
        calls = gw.store.calls_for([r.id for r in gw.store.list_rollouts(limit=100)])
    assert len(steps) == 3
    assert all(s["staleness/max"] == 0 and s["groups/carried_over"] == 0 for s in steps)
    assert all(s["adapter/rollouts"] == 4 for s in steps)  # batch_groups x n
    assert all(s["flags/network_rate"] == 1.0 for s in steps)  # flag events become rates
    # every step's rollouts were served by one version: the one trained in that step
    versions = sorted({c.model_version for cs in calls.values() for c in cs})
    assert versions == [0, 1, 2]
    # mixed rewards: every group was trained
    assert all(s["adapter/rollouts_trained"] == 4 for s in steps)
    assert all(s["actor/optimizer_steps"] == 2 for s in steps)
    # 2 calls each
    assert all(s["calls/agent/trained"] == 8 and "calls/agent/untrained" not in s for s in steps)
    # each rollout's first call: its penalty is trained
    assert all(s["adapter/calls_shaped"] == 4 for s in steps)
    assert all(
        s["adapter/trained_tokens"] > 0 and math.isfinite(s["actor/grad_norm"]) for s in steps
    )
    run = tmp_path / "run"
    assert (
        len((run / "metrics.jsonl").read_text().splitlines()) >= 3
        and (run / "latest").read_text() == "step_3"
    )
    assert (run / "step_3" / "model" / "config.json").is_file() and (
        run / "step_3" / "actor"
    ).is_dir()


def test_a_step_without_samples_pauses_nothing_and_keeps_the_version(
    tiny_path: Path, tmp_path: Path
) -> None:
    """A group whose rewards are all equal has nothing to learn from: a step of only such groups
    neither pauses the gateway nor pushes weights, and the version stays (no checkpoint is due)."""
    with stack(tiny_path, tmp_path) as gw:
        # two tasks with mixed rewards
        equal = {i: float(i % 2) for i in range(20) if i not in (10, 16)}
        extra = ["agl.mode=sync", "agl.batch_groups=1", "trainer.save_freq=-1"]
        steps = run_loop(gw, tmp_path, *extra, rewards=equal)
        versions = [int(s["version"]) for s in steps]
        check_versions(gw, versions[-1])
    assert len(steps) == 3
    updated = [s["adapter/samples"] > 0 for s in steps]
    # the tasks' order is the seed's
    assert versions == list(itertools.accumulate(updated)) and 0 < versions[-1] < 3
    assert all(
        s["timing/paused_s"] == 0 and "timing/update_s" not in s
        for s, u in zip(steps, updated, strict=True)
        if not u
    )


def test_async_mode_carries_groups_over_and_drops_stale_rollouts(
    tiny_path: Path, tmp_path: Path
) -> None:
    with stack(tiny_path, tmp_path) as gw:
        extra = [
            "agl.mode=async",
            "agl.batch_groups=1",
            "agl.active_groups=4",
            "agl.max_staleness=0",
        ]
        steps = run_loop(gw, tmp_path, *extra, sleep=1.0)
        # a step of nothing but stale rollouts makes no version
        check_versions(gw, int(steps[-1]["version"]))
        left = gw.store.list_rollouts(limit=1000)
        # the groups still running at the end were cancelled
        assert all(r.status.terminal for r in left)
    assert len(steps) == 3
    # launched before an update, trained after it
    assert sum(s["groups/carried_over"] for s in steps) >= 1
    assert max(s["staleness/max"] for s in steps) >= 1
    # beyond max_staleness=0: counted
    assert sum(s["adapter/rollouts_dropped_stale"] for s in steps) >= 1


def test_a_killed_run_resumes_without_losing_or_repeating_groups(
    tiny_path: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "agl.cli", "train", str(DEMO)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    with stack(tiny_path, tmp_path) as gw, controller(gw, tmp_path, None):
        # a checkpoint per step
        every_step = ["agl.batch_groups=1", "agl.active_groups=3", "trainer.save_freq=1"]
        args = [*argv, *overrides(gw, tmp_path, 0.5, *every_step)]
        with (tmp_path / "first.log").open("wb") as log:
            first = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not (run / "latest").is_file() or (run / "latest").read_text() != "step_1":
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after 120 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, timeout=240)
        assert second.returncode == 0, second.stderr.decode()[-3000:]
        check_versions(gw, 3)
        state = json.loads((run / "step_3" / "state.json").read_text())
        trained = [g for step in state["trained"] for g in step]
        assert len(trained) == len(set(trained)) == 3  # one group per step, none twice
        launched = {r.group for r in gw.store.list_rollouts(limit=1000)}
        assert launched == set(trained) | {g["id"] for g in state["groups"]}  # none lost
        for group in launched:  # none launched twice
            assert len(gw.store.list_rollouts(group=group, limit=10)) == 2
    assert [h["version"] for h in state["history"] if "version" in h] == [1.0, 2.0, 3.0]


def test_a_run_killed_after_an_update_it_did_not_checkpoint_resumes_on_a_new_version(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """With a checkpoint every 2 steps, a run killed once step 3's update is served (version 3)
    resumes from step 2's checkpoint, whose weights it serves as version 4, and trains steps 3
    and 4 as later versions (version 3's weights were lost, and a version is registered once)."""
    argv = [sys.executable, "-m", "agl.cli", "train", str(DEMO)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    with stack(tiny_path, tmp_path) as gw, controller(gw, tmp_path, None):
        extra = [
            "agl.batch_groups=1",
            "agl.active_groups=2",
            "trainer.save_freq=2",
            "trainer.total_training_steps=4",
        ]
        args = [*argv, *overrides(gw, tmp_path, 0.0, *extra)]
        with (tmp_path / "first.log").open("wb") as log:
            first = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while (gw.admin.get("/api/state").json().get("latest_model") or {}).get("version") != 3:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "version 3 not served after 180 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert (tmp_path / "run" / "latest").read_text() == "step_2"
        second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, timeout=240)
        assert second.returncode == 0, second.stderr.decode()[-3000:]
        state = json.loads((tmp_path / "run" / "step_4" / "state.json").read_text())
        versions = [int(h["version"]) for h in state["history"] if "version" in h]
        check_versions(gw, versions[-1])
    # steps 1-2 as checkpointed; then version 4 or later (5, 6 for steps with samples): never 3 again
    assert versions[:2] == [1, 2] and 4 <= versions[2] <= versions[3] and versions[3] >= 5


def test_validation_runs_first_every_test_freq_steps_and_at_the_end_each_round_greedy_on_one_version(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    val = [{"q": f"held out {i}", "reward": float(i % 2)} for i in range(3)]
    with stack(tiny_path, tmp_path) as gw:
        extra = ["agl.mode=async", "trainer.test_freq=2", "trainer.val_before_train=true"]
        history = run_loop(gw, tmp_path, *extra, val=val, full=True)
        rounds = [h for h in history if "val/reward_mean" in h]
        val_rollouts = [r for r in gw.store.list_rollouts(limit=1000) if r.mode is Mode.VAL]
        calls = gw.store.calls_for([r.id for r in val_rollouts])
    assert [(h["val/step"], h["val/version"]) for h in rounds] == [(0, 0), (2, 2), (3, 3)]
    assert all(h["val/reward_mean"] == pytest.approx(1 / 3) for h in rounds)
    assert len(val_rollouts) == 3 * len(val)
    by_round = {}
    for r in val_rollouts:
        by_round.setdefault(r.group.split("/")[1], set()).update(
            c.model_version for c in calls[r.id]
        )
    assert by_round == {"val0": {0}, "val2": {2}, "val3": {3}}  # no update while a round was out
    # greedy, whatever the harness asked
    assert {c.temperature for cs in calls.values() for c in cs} == {0.0}
    steps = [h for h in history if "reward/mean" in h]
    # training calls: the harness's 1.0
    assert all(s["adapter/calls_temperature_mismatch"] == 0 for s in steps)
    for key in (
        "actor/entropy",
        "actor/kl_k3",
        "actor/grad_norm",
        "actor/tis_max",
        "rollout/sampled_entropy",
    ):
        assert all(key in s for s in steps if "timing/update_s" in s), key
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == history


@pytest.mark.parametrize("action", ["stop", "restore"])
def test_the_guard_stops_or_restores_the_best_weights_when_validation_falls(
    tiny_path: Path,
    tmp_path: Path,
    action: str,
) -> None:
    """Validation scores 1 before training and 0 after it (each task scores 1 only the first time it
    runs). Its rollouts are slow, so training groups are ready when a round ends: none is trained
    after a stop."""
    val = [{"q": f"held out {i}", "once": True, "sleep": 1.0} for i in range(2)]
    extra = [
        "agl.mode=sync",
        "trainer.test_freq=1",
        "agl.guard_drop=0.5",
        f"agl.guard_action={action}",
    ]
    with stack(tiny_path, tmp_path) as gw:
        history = run_loop(
            gw, tmp_path, *extra, "trainer.total_training_steps=2", val=val, full=True
        )
        served = {n: p.detach().clone() for n, p in gw.engine.model.named_parameters()}
        models = gw.store.models()
    rounds = [h["val/reward_mean"] for h in history if "val/reward_mean" in h]
    guards = [h for h in history if "guard/step" in h]
    trained = [h for h in history if "reward/mean" in h]
    if action == "stop":
        # stopped at the first fall; no final round
        assert rounds == [1.0, 0.0] and len(trained) == 1
        assert [(g["guard/step"], g["guard/best"], g["guard/reward"]) for g in guards] == [
            (1, 1.0, 0.0)
        ]
        return
    assert (
        rounds == [1.0, 0.0, 0.0]
        and len(trained) == 2
        and [g["guard/step"] for g in guards] == [1, 2]
    )
    # each fall restored the weights validated first (the starting ones) as a new version
    assert [m.version for m in models] == [0, 1, 2, 3, 4] and models[2].path.endswith("best")
    start = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    assert all(torch.equal(served[n], p) for n, p in start.named_parameters())


def test_a_temperature_no_call_was_sampled_at_fails_naming_the_field(
    tiny_path: Path, tmp_path: Path
) -> None:
    with (
        stack(tiny_path, tmp_path) as gw,
        pytest.raises(ConfigError, match=r"agl.temperature=0.5 .*sampled at 1.0"),
    ):
        run_loop(gw, tmp_path, "agl.mode=sync", "agl.temperature=0.5")


class DiskBackend:
    """What `Trainer.restore` uses of the backend, with the real `DiskEngine` over the real
    embedded engine. The trainer's weights are a transformers model: verl's workers are not needed
    to check what restore does."""

    def __init__(self, engine_url: str, model: Path, weights: Path) -> None:
        from trainer.engines import DiskEngine

        self.url = engine_url
        self.model = AutoModelForCausalLM.from_pretrained(model)
        self.engine = DiskEngine(engine_url, weights, self.model.save_pretrained)
        self.released_at_load: list[bool] = []

    def load(self, path: Path) -> None:
        self.released_at_load.append(httpx.get(self.url + "/model_info").json()["released"])
        self.model = AutoModelForCausalLM.from_pretrained(path / "model")


def restore(gw: Stack, tmp_path: Path, backend: DiskBackend) -> None:
    from agl.client import GatewayClient
    from trainer.loop import Trainer

    (tmp_path / "tasks.jsonl").write_text('{"q": "count"}\n')
    cfg, agl = load_config(
        DEMO, [*gw.train_overrides(tmp_path / "run"), f"agl.tasks={tmp_path / 'tasks.jsonl'}"]
    )

    async def run() -> None:
        async with GatewayClient(gw.url, ADMIN) as client:
            await Trainer(cfg, agl, backend, client, tracker=None).restore()  # type: ignore[arg-type]

    try:
        asyncio.run(run())
    finally:
        backend.engine.close()


def perturbed(model: Path, out: Path) -> Path:
    changed = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.5)
    changed.save_pretrained(out)
    return out


def test_a_restart_without_a_checkpoint_serves_the_trainers_weights_as_a_new_version(
    tiny_path: Path,
    tmp_path: Path,
) -> None:
    """The engine served version 3 (trained weights) when the trainer died before any checkpoint:
    the new trainer holds the base weights, so the engine must serve those, named 4, as the gateway
    does."""
    with stack(tiny_path, tmp_path) as gw:
        gw.admin.post("/api/models", json={"version": 3}).raise_for_status()
        trained = perturbed(tiny_path, tmp_path / "trained")
        load = {"model_path": str(trained), "weight_version": "3"}
        httpx.post(gw.engine_url + "/update_weights_from_disk", json=load).raise_for_status()
        restore(gw, tmp_path, DiskBackend(gw.engine_url, tiny_path, tmp_path / "run" / "weights"))
        info = httpx.get(gw.engine_url + "/model_info").json()
        state = gw.admin.get("/api/state").json()
    assert (
        info["weight_version"] == "4"
        and state["version"] == 4
        and state["latest_model"]["version"] == 4
    )
    assert info["model_path"] == str(tmp_path / "run" / "weights" / "v4" / "model")


def test_a_checkpoint_is_loaded_only_once_the_engine_sleeps(
    tiny_path: Path, tmp_path: Path
) -> None:
    """On GPUs, sglang holds its share of the memory until it sleeps: loading before would not
    fit."""
    with stack(tiny_path, tmp_path) as gw:
        gw.admin.post("/api/models", json={"version": 2}).raise_for_status()
        checkpoint = tmp_path / "run" / "step_2"
        perturbed(tiny_path, checkpoint / "model")
        state = {
            "step": 2,
            "version": 2,
            "cursor": 0,
            "history": [],
            "trained": [],
            "best": None,
            "groups": [],
        }
        (checkpoint / "state.json").write_text(json.dumps(state))
        (tmp_path / "run" / "latest").write_text("step_2")
        backend = DiskBackend(gw.engine_url, tiny_path, tmp_path / "run" / "weights")
        restore(gw, tmp_path, backend)
        info = httpx.get(gw.engine_url + "/model_info").json()
    assert backend.released_at_load == [True]
    assert (
        info["weight_version"] == "2"
        and info["model_path"] == str(checkpoint / "model")
        and not info["released"]
    )


def test_a_restart_while_harnesses_call_pauses_the_gateway_before_the_engine_sleeps(
    tiny_path: Path, tmp_path: Path
) -> None:
    """Harness runs outlive a trainer: when a new one restores, calls are streaming. It pauses the
    gateway first, so the engine sleeps and loads only once the calls in flight have ended; on
    sglang, which asserts it is idle then, sleeping under a stream killed the server. The
    harness's calls go on after the restore, under the new version."""
    sglang = SglangStandIn(tiny_path, ["word " * 60] * 200, token_delay_s=0.005)
    with sglang_stack(sglang, tmp_path) as gw:
        gw.admin.post("/api/models", json={"version": 3}).raise_for_status()
        gw.admin.post(
            "/api/resume", json={"version": 3}
        ).raise_for_status()  # as the last trainer left it
        r = gw.rollout()
        harness = StreamingHarness(gw.openai_client(r["agent_token"], max_retries=0))
        harness.start()
        harness.wait_for_answers(1)
        backend = DiskBackend(gw.engine_url, tiny_path, tmp_path / "run" / "weights")
        restore(gw, tmp_path, backend)
        after = len(harness.answered)
        harness.wait_for_answers(after + 2)
        harness.stop()
        versions = [
            c["model_version"] for c in gw.admin.get(f"/api/rollouts/{r['id']}/calls").json()
        ]
    assert sglang.died is None and harness.errors == []
    assert sglang.log.generated_while_released == 0
    assert versions[-1] == 4 and set(versions) == {3, 4}


class StreamingHarness(threading.Thread):
    """A harness that streams one call after another until stopped, as a coding agent does."""

    def __init__(self, client: openai.OpenAI) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.answered: list[str] = []
        self.errors: list[Exception] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        messages = [{"role": "user", "content": "Go on."}]
        while not self.stopped.is_set():
            try:
                stream = self.client.chat.completions.create(
                    model="m",
                    messages=messages,
                    max_tokens=100,
                    stream=True,  # type: ignore[arg-type]
                )
                self.answered.append("".join(c.choices[0].delta.content or "" for c in stream))
            except openai.OpenAIError as e:
                self.errors.append(e)
                return

    def wait_for_answers(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.answered) < count:
            assert not self.errors and time.monotonic() < deadline, self.errors
            time.sleep(0.01)

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)
