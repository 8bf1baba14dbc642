"""`agl train CONFIG [key=value ...]`: rollouts through unchanged harnesses become policy updates.

- `Trainer` is the training loop (docs/architecture.md, "Collocated async RL"): it launches
  groups, trains on the ended ones, serves each new version, validates and keeps the best.
- Checkpoints are `trainer/checkpoints.py`'s, step metrics and progress output
  `trainer/metrics.py`'s; the model and its engines are the backend's (`trainer/backend.py`).
- It speaks only the gateway's admin API (create rollouts carrying the spec the controller runs,
  read their status and calls, pause, resume, register model versions); it launches no harness
  (the controller does) and never opens the store.
- Groups are named `{experiment_name}/{index}`, so a restarted run finds the groups it launched
  after its last checkpoint instead of launching them again.
"""

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from adapters import AdapterSettings, Batch, build_batch
from agl.client import GatewayClient, GatewayError, call_from_json
from agl.types import JSON, Call, Mode, Rollout, Status
from trainer.checkpoints import Checkpoints, Group, TrainerState
from trainer.config import AglConfig, ConfigError, load_config
from trainer.engines import base_model_path, engine_http
from trainer.metrics import Pace, Progress, mean, step_metrics

if TYPE_CHECKING:
    from trainer.backend import Backend

log = logging.getLogger(__name__)


def read_tasks(path: str, spec: JSON | None) -> list[JSON]:
    """One JSON object per line: a task (run with `agl.spec`), or `{"task", "spec", "grader"}` (its
    own spec)."""
    tasks = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not tasks or not all(isinstance(t, dict) for t in tasks):
        raise ConfigError(f"{path}: expected one JSON object per line")
    if spec is None and not all("spec" in t for t in tasks):
        raise ConfigError(f"{path}: a task without its own `spec` needs agl.spec")
    return tasks


@dataclasses.dataclass(frozen=True)
class Fetched:
    """A batch's ended groups as the gateway has them."""

    rollouts: list[Rollout]
    calls: dict[str, list[Call]]  # per rollout ID, as the gateway lists them
    # per `flag` event name (reward-hacking checks): `flags/NAME_rate`, the share of rollouts with one
    flags: dict[str, float]
    # per rollout and call seq: the sum of the call's intermediate rewards (of its last attempt)
    intermediate: dict[str, Counter[int]]


class Trainer:
    """One run's training loop: launches groups through the gateway, trains the backend on the ended
    ones, serves each new version, validates, and checkpoints its `TrainerState`."""

    def __init__(
        self, cfg: DictConfig, agl: AglConfig, backend: "Backend", gw: GatewayClient, tracker: Any
    ) -> None:
        self.cfg = cfg
        self.agl = agl
        self.backend = backend
        self.gw = gw
        self.tracker = tracker
        self.name = str(cfg.trainer.experiment_name)
        keep = int(cfg.trainer.get("max_actor_ckpt_to_keep") or 2)
        self.checkpoints = Checkpoints(Path(cfg.trainer.default_local_dir), backend, keep)
        self.tasks = read_tasks(agl.tasks, agl.spec)
        # the order is the seed's: a restart sees the same one
        random.Random(agl.seed).shuffle(self.tasks)
        self.val_tasks: list[JSON] = []
        if agl.val_tasks:
            self.val_tasks = read_tasks(agl.val_tasks, agl.spec)
        self.steps = int(cfg.trainer.total_training_steps)
        self.state = TrainerState()
        self.val: list[Group] = []  # validation groups of the round out
        self.stopped = False  # by the guard
        self.pace = Pace()
        self.progress = Progress(self.steps)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Train until the last step (or the guard stops it); no update while a validation round is
        out."""
        await self.restore()
        try:
            if self.state.step == 0 and self.cfg.trainer.get("val_before_train"):
                await self.launch_validation()
            while self.state.step < self.steps and not self.stopped:
                await self.launch_groups()
                ready = [g for g in self.state.groups if await self.ended([g]) is not None]
                if self.agl.mode == "async":
                    needed = self.agl.batch_groups
                else:
                    needed = len(self.state.groups)
                if await self.finish_validation() and not self.stopped and len(ready) >= needed:
                    await self.train_step(ready[: self.agl.batch_groups])
                else:
                    await asyncio.sleep(self.agl.poll_s)
            # the final validation, unless the last step launched it
            if not self.stopped and not self.val:
                await self.launch_validation()
            while not await self.finish_validation():
                await asyncio.sleep(self.agl.poll_s)
        finally:
            with contextlib.suppress(GatewayError):
                await self.cancel_unfinished()
            self.progress.close()

    async def cancel_unfinished(self) -> None:
        """The run is over: end the rollouts still running (their harnesses get 403 and stop)."""
        for r in await self.members(self.state.groups + self.val):
            if not r.status.terminal:
                with contextlib.suppress(GatewayError):  # it ended meanwhile
                    await self.gw.set_status(r.id, Status.CANCELLED, reason="training finished")

    async def launch_groups(self) -> None:
        """Async: keep `active_groups` running. Sync: launch `batch_groups` once the last batch is
        trained."""
        if self.agl.mode == "async":
            want = self.agl.active_groups
        elif self.state.groups:
            want = 0
        else:
            want = self.agl.batch_groups
        while len(self.state.groups) < want:
            await self.launch_next()

    async def launch_next(self, known: Sequence[str] = ()) -> None:
        """The next task's group, `{experiment_name}/{cursor}`: `agl.n` rollouts, of which `known`
        exist already."""
        cursor = self.state.cursor
        entry = self.tasks[cursor % len(self.tasks)]
        group = await self.launch(
            f"{self.name}/{cursor}", entry, self.agl.n - len(known), Mode.TRAIN, None
        )
        group.rollouts[:0] = known
        self.state.groups.append(group)
        self.state.cursor += 1

    async def launch(
        self, group: str, entry: JSON, n: int, mode: Mode, sampling: JSON | None
    ) -> Group:
        """`n` rollouts of one task entry: the task itself, or `{"task", "spec", "grader"}`."""
        if "spec" in entry:
            task = entry.get("task", {})
            spec = entry["spec"]
        else:
            task = entry
            spec = self.agl.spec
        meta = {"spec": spec, "trainer": self.name}
        create = partial(
            self.gw.create_rollout,
            task,
            group,
            mode=mode,
            grader=entry.get("grader"),
            metadata=meta,
        )
        ids = [(await create(sampling=sampling))["id"] for _ in range(n)]
        return Group(id=group, rollouts=ids, version=self.state.version)

    async def members(self, groups: list[Group]) -> list[Rollout]:
        """The groups' rollouts, as the gateway lists them now."""
        ids = {i for g in groups for i in g.rollouts}
        listed = [
            r
            for g in groups
            for r in await self.gw.list_rollouts(group=g.id, limit=len(g.rollouts) + 100)
        ]
        return [r for r in listed if r.id in ids]

    async def ended(self, groups: list[Group]) -> list[Rollout] | None:
        """The groups' rollouts once every one has ended, else None."""
        listed = await self.members(groups)
        done = len(listed) >= sum(len(g.rollouts) for g in groups) and all(
            r.status.terminal for r in listed
        )
        if not done:
            return None
        return listed

    async def train_step(self, groups: list[Group]) -> None:
        """Batch -> pause (drained) -> sleep -> update -> save -> push -> wake -> register ->
        resume. A batch without samples (every group's rewards equal, or its rollouts stale or
        failed) makes a step without an update: nothing is paused or pushed and the version stays,
        unless a checkpoint is due."""
        state = self.state
        # ended: built while harnesses still run
        fetched = await self.fetch(groups)
        base = state.version  # the policy the batch is trained against
        batch = self.batch(fetched, base)
        state.step += 1
        state.trained.append([g.id for g in groups])
        state.groups = [g for g in state.groups if g not in groups]
        due = self.checkpoint_due()
        updates = bool(batch.n_samples) or due
        started = time.monotonic()
        metrics: dict[str, float] = {}
        drain_s = 0.0
        if updates:
            await self.gw.pause()
            drain_s = time.monotonic() - started
            metrics = await self.update(batch)
        metrics |= step_metrics(
            fetched.rollouts,
            fetched.calls,
            batch,
            self.adapter_settings,
            base=base,
            version=state.version,
            elapsed=self.pace.lap(),
        )
        metrics |= fetched.flags
        metrics |= {
            "timing/drain_s": drain_s,
            "groups/carried_over": sum(g.version < base for g in groups),
        }
        state.history.append(metrics)
        paused_s = 0.0
        if updates:
            checkpoint = None
            if due:
                checkpoint = await asyncio.to_thread(self.checkpoints.save, state)
            await self.publish(checkpoint)
            paused_s = time.monotonic() - started
        # after the checkpoint: its history has no pause time for this step
        metrics["timing/paused_s"] = paused_s
        self.tracker.log(data=metrics, step=state.step)
        self.progress.step(state.step, metrics)
        test_freq = self.cfg.trainer.test_freq
        if test_freq > 0 and state.step % test_freq == 0:
            await self.launch_validation()

    @cached_property
    def adapter_settings(self) -> AdapterSettings:
        """How the adapter turns this run's calls into batches."""
        minibatch_rollouts = int(self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
        return self.agl.adapter(self.backend.dp_size, minibatch_rollouts)

    def batch(self, fetched: Fetched, base: int) -> Batch:
        """The training batch of the fetched rollouts, trained against version `base`."""
        batch = build_batch(
            fetched.rollouts,
            fetched.calls,
            self.adapter_settings,
            version=base,
            intermediate=fetched.intermediate,
        )
        self.check_temperature(batch, fetched.calls)
        return batch

    async def update(self, batch: Batch) -> dict[str, float]:
        """The engines asleep (the gateway paused and drained), the batch trained if it has samples,
        the version bumped: the backend's metrics."""
        await asyncio.to_thread(self.backend.engine.sleep)
        metrics: dict[str, float] = {}
        if batch.n_samples:
            metrics = await asyncio.to_thread(self.backend.update, batch)
        self.state.version += 1
        return metrics

    def checkpoint_due(self) -> bool:
        """A checkpoint every `trainer.save_freq` steps (if positive), and after the last step
        (unless it is -1)."""
        freq = int(self.cfg.trainer.save_freq)
        periodic = freq > 0 and self.state.step % freq == 0
        last = freq >= 0 and self.state.step == self.steps
        return periodic or last

    def check_temperature(self, batch: Batch, calls: dict[str, list[Call]]) -> None:
        """Calls sampled at another temperature than `agl.temperature` were not trained (their
        log-probs are of another distribution); when that is every call, the config is wrong."""
        m = batch.metrics
        if not m["calls_temperature_mismatch"]:
            return
        seen = sorted(
            {c.temperature for cs in calls.values() for c in cs}, key=lambda t: (t is None, t or 0)
        )
        if m["calls_temperature_mismatch"] == m["calls"] - m["calls_untrained"]:
            raise ConfigError(
                f"agl.temperature={self.agl.temperature} matches none of the batch's "
                f"{int(m['calls'])} calls (sampled at {', '.join(map(str, seen))}); "
                "set it to the temperature the harnesses sample at"
            )
        log.warning(
            "%d of %d calls were sampled at a temperature other than agl.temperature=%s "
            "(seen: %s): not trained",
            m["calls_temperature_mismatch"],
            m["calls"],
            self.agl.temperature,
            seen,
        )

    async def fetch(self, groups: list[Group]) -> Fetched:
        """The groups' rollouts, their calls, their flags and intermediate rewards."""
        rollouts = await self.members(groups)
        calls = {r.id: [call_from_json(c) for c in await self.gw.calls(r.id)] for r in rollouts}
        flags: Counter[str] = Counter()
        intermediate: dict[str, Counter[int]] = {r.id: Counter() for r in rollouts}
        for r in rollouts:
            events = await self.gw.events(r.id)
            flags.update({str(e["data"].get("flag")) for e in events if e["kind"] == "flag"})
            for e in (e for e in events if e["kind"] == "reward" and e["attempt"] == r.attempt):
                if not e["data"].get("final", True) and e["data"].get("call_seq") is not None:
                    intermediate[r.id][e["data"]["call_seq"]] += e["data"]["value"]
        return Fetched(
            rollouts=rollouts,
            calls=calls,
            flags={f"flags/{name}_rate": n / len(rollouts) for name, n in flags.items()},
            intermediate=intermediate,
        )

    # ------------------------------------------------------------------ validation

    async def launch_validation(self) -> None:
        """A round of `val_kwargs.n` rollouts per validation task (greedy unless
        `val_kwargs.do_sample`); no update happens until it has ended, so the whole round is served
        by one version."""
        if not self.val_tasks:
            return
        kw = self.cfg.actor_rollout_ref.rollout.val_kwargs
        sampling = {"temperature": 0.0}  # greedy
        if kw.do_sample:
            sampling = {"temperature": float(kw.temperature), "top_p": kw.top_p, "top_k": kw.top_k}
        self.val = [
            await self.launch(
                f"{self.name}/val{self.state.step}/{i}", task, int(kw.n), Mode.VAL, sampling
            )
            for i, task in enumerate(self.val_tasks)
        ]

    async def finish_validation(self) -> bool:
        """Once every rollout of the round has ended: log its mean reward (infra failures aside)
        and apply the guard. True when no round is out."""
        if not self.val:
            return True
        if (rollouts := await self.ended(self.val)) is None:
            return False
        counted = [r for r in rollouts if r.counts]
        reward = mean([r.reward or 0.0 for r in counted])
        step = self.state.step
        version = self.state.version
        m = {
            "val/reward_mean": reward,
            "val/step": float(step),
            "val/version": float(version),
        }
        self.tracker.log(data=m | {"val/rollouts": float(len(counted))}, step=step)
        self.state.history.append(m)
        self.val = []
        self.progress.validation(step, version, reward, len(counted))
        await self.guard(reward)
        return True

    async def guard(self, reward: float) -> None:
        """Keep the best validated weights (for `restore`); act when reward falls `guard_drop`
        below the best."""
        drop = self.agl.guard_drop
        action = self.agl.guard_action
        state = self.state
        if drop is None:
            return
        if state.best is None or reward > state.best:
            state.best = reward
            if action == "restore":
                await asyncio.to_thread(self.checkpoints.save, state, "best")
            return
        if reward > state.best - drop:
            return
        state.history.append(
            {"guard/step": float(state.step), "guard/best": state.best, "guard/reward": reward}
        )
        self.tracker.log(data={"guard/triggered": 1.0}, step=state.step)
        log.warning(
            "validation reward %.3f is more than %.3f below its best, %.3f: %s",
            reward,
            drop,
            state.best,
            action,
        )
        if action == "stop":
            self.stopped = True
            return
        await self.gw.pause()
        await asyncio.to_thread(self.backend.engine.sleep)
        best = self.checkpoints.path("best")
        await asyncio.to_thread(self.backend.load, best)
        state.version += 1
        await self.publish(best)

    async def publish(self, path: Path | None) -> None:
        """The paused gateway resumes on the state's version: weights pushed (saved at `path`),
        engines awake, registered."""
        version = self.state.version
        await asyncio.to_thread(self.backend.engine.push, path, version)
        await asyncio.to_thread(self.backend.engine.wake)
        await self.gw.register_model(
            version, path=str(path or ""), endpoints=self.backend.engine.endpoints()
        )
        await self.gw.resume(version)

    # ------------------------------------------------------------------ restarts

    async def wait_for_gateway(self, timeout_s: float = 900) -> JSON:
        """The gateway's state, once it answers (on GPUs it starts after the engines this trainer
        made)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await self.gw.state()
            except GatewayError as e:
                if e.status or time.monotonic() > deadline:
                    raise
                log.info("waiting for the gateway at %s", self.agl.gateway)
                await asyncio.sleep(2)

    async def restore(self) -> None:
        """Continue from the latest checkpoint, adopting groups launched after it. Whenever a
        version was served before, the engines get the trainer's weights again (the gateway paused
        meanwhile), as a new version if updates after the checkpoint (or with no checkpoint, every
        update) were lost: what they serve is then what the trainer holds."""
        # only this trainer registers versions
        registered = (await self.wait_for_gateway()).get("latest_model")
        checkpoint = None
        if self.cfg.trainer.resume_mode != "disable":
            checkpoint = self.checkpoints.latest()
        if checkpoint is not None:
            self.state = self.checkpoints.state(checkpoint)
            self.progress.at(self.state.step)
        state = self.state
        # updates after the checkpoint were lost: the trainer's weights are served again,
        # as a new version
        if registered and registered["version"] > state.version:
            state.version = registered["version"] + 1
        if checkpoint is not None or registered:
            # harnesses may still call (their runs outlive a trainer): the gateway holds their
            # calls, and the engines sleep once the calls in flight have ended; then the weights
            # load: sglang holds its share of the GPUs' memory until it sleeps
            await self.gw.pause()
            await asyncio.to_thread(self.backend.engine.sleep)
            if checkpoint is not None:
                await asyncio.to_thread(self.backend.load, checkpoint)
            await asyncio.to_thread(self.backend.engine.push, checkpoint, state.version)
            await asyncio.to_thread(self.backend.engine.wake)
            log.info(
                "resumed from %s: step %d, version %d",
                checkpoint or "the base weights",
                state.step,
                state.version,
            )
        if not registered or registered["version"] < state.version:
            await self.gw.register_model(state.version, endpoints=self.backend.engine.endpoints())
        await self.gw.resume(state.version)
        # groups launched after the checkpoint (or before a crash that left none): the cursor
        # names them
        while found := await self.gw.list_rollouts(
            group=f"{self.name}/{state.cursor}", limit=self.agl.n + 1
        ):
            await self.launch_next([r.id for r in found])


def set_base_model(cfg: DictConfig, agl: AglConfig, out: Path) -> None:
    """A config that names no model trains the one `agl.engine` served when the run began:
    training starts there and the KL's reference is it. `out/base_model` keeps its path for
    restarts, when the engine serves trained weights."""
    remembered = out / "base_model"
    known = ""
    if remembered.is_file() and cfg.trainer.resume_mode != "disable":
        known = remembered.read_text().strip()
    model = cfg.actor_rollout_ref.model
    with engine_http(30) as http:
        path = base_model_path(str(model.get("path") or ""), agl.engine, http, known=known)
    if path is None:
        return
    if not known:
        remembered.write_text(path)
    model.path = path  # verl's config has the key: no open_dict needed


async def train(cfg: DictConfig, agl: AglConfig) -> list[dict[str, float]]:
    """A whole run, from the config: the backend started, the loop run, its history returned (and
    written to `metrics.jsonl`), the backend closed."""
    from verl.utils.tracking import Tracking

    from trainer.backend import Backend  # verl, Ray, torch: only once training starts

    out = Path(cfg.trainer.default_local_dir)
    out.mkdir(parents=True, exist_ok=True)
    set_base_model(cfg, agl, out)
    backend = Backend(cfg, agl)
    # for `agl gateway --engine-url`
    (out / "engines.txt").write_text(",".join(backend.engine.endpoints()) + "\n")
    os.environ.setdefault("TENSORBOARD_DIR", str(out / "tensorboard"))
    tracker = Tracking(
        project_name=cfg.trainer.project_name,
        experiment_name=cfg.trainer.experiment_name,
        default_backend=list(cfg.trainer.logger),
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    try:
        async with GatewayClient(agl.gateway, agl.admin_key, timeout_s=3600) as gw:
            loop = Trainer(cfg, agl, backend, gw, tracker)
            await loop.run()
        history = loop.state.history
        (out / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
        return history
    finally:
        backend.close()
        del tracker


def main(argv: list[str]) -> int:
    """`agl train`'s command line; exits with a usage error on a config error."""
    parser = argparse.ArgumentParser(prog="agl train", description=__doc__.split("\n")[0])
    parser.add_argument(
        "config", help="YAML: `defaults: [ppo_trainer, _self_]` plus an `agl:` section"
    )
    parser.add_argument("overrides", nargs="*", help="key=value (Hydra syntax), e.g. agl.n=8")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine call otherwise
    try:
        cfg, agl = load_config(args.config, args.overrides)
        asyncio.run(train(cfg, agl))
    # also one found once calls are seen (a temperature none was sampled at)
    except ConfigError as e:
        parser.error(str(e))
    return 0
