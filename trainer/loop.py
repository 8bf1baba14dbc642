"""`agl train CONFIG [key=value ...]`: rollouts through unchanged harnesses become policy updates.

Owns the training loop (docs/architecture.md, "Collocated async RL"), its checkpoints and its
progress output. It speaks only the gateway's admin API (create rollouts carrying the spec the
controller runs, read their status and calls, pause, resume, register model versions); the backend
(`trainer/backend.py`) owns the model and its engines. It launches no harness (the controller does)
and never opens the store. Groups are named `{experiment_name}/{index}`, so a restarted run finds
the groups it launched after its last checkpoint instead of launching them again.
"""

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from adapters import AdapterSettings, Batch, build_batch
from agl.client import GatewayClient, GatewayError, call_from_json
from agl.types import JSON, Call, Mode, Rollout, Status
from trainer.config import AglConfig, ConfigError, load_config
from trainer.engines import base_model_path, engine_http

if TYPE_CHECKING:
    from trainer.backend import Backend

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Group:
    """One task's rollouts, launched together: `agl.n` of them, or a validation round's share."""

    id: str
    rollouts: list[str]
    version: int  # the model version when it was launched


def read_tasks(path: str, spec: JSON | None) -> list[JSON]:
    """One JSON object per line: a task (run with `agl.spec`), or `{"task", "spec", "grader"}` (its
    own spec)."""
    tasks = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not tasks or not all(isinstance(t, dict) for t in tasks):
        raise ConfigError(f"{path}: expected one JSON object per line")
    if spec is None and not all("spec" in t for t in tasks):
        raise ConfigError(f"{path}: a task without its own `spec` needs agl.spec")
    return tasks


@dataclasses.dataclass
class TrainerState:
    """What a checkpoint keeps of a run: its `state.json`, one key per field, in this order."""

    step: int = 0
    version: int = 0  # the model version the engines serve
    cursor: int = 0  # the next task's index, which names its group
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    # the group IDs of each step: none trained twice, none lost
    trained: list[list[str]] = dataclasses.field(default_factory=list)
    best: float | None = None  # the best validation reward so far (the guard's)
    # launched, not yet trained on, in launch order
    groups: list[Group] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        """The text of `state.json`."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        """The state a `state.json` holds; a key it lacks keeps its default, others are ignored."""
        saved = json.loads(text)
        known = {f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved}
        known["groups"] = [Group(**g) for g in known.get("groups", [])]
        return cls(**known)


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
        self.dir = Path(cfg.trainer.default_local_dir)
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
        self.last_step_at = time.monotonic()
        self.bar = tqdm(total=self.steps, desc="train", unit="step", dynamic_ncols=True)

    def progress(self, m: dict[str, float]) -> None:
        """The step's line under the progress bar, and the bar moved on."""
        self.bar.update(self.state.step - self.bar.n)
        shown = {
            "reward": m["reward/mean"],
            "stale": m["staleness/mean"],
            "calls/s": m["rollout/calls_per_s"],
        }
        self.bar.set_postfix({k: f"{v:.2f}" for k, v in shown.items()})
        learned = ""
        update = "(no samples: no update)"
        if "timing/update_s" in m:
            learned = f"entropy {m['actor/entropy']:.3f}, kl {m['actor/kl_k3']:.4f}, "
            learned += f"grad norm {m['actor/grad_norm']:.2f}, "
            update = f"(update {m['timing/update_s']:.1f} s)"
        self.bar.write(
            f"step {self.state.step}: reward {m['reward/mean']:.3f} "
            f"over {int(m['adapter/rollouts'])} rollouts "
            f"({m['adapter/degenerate_rate']:.0%} of groups degenerate), {learned}"
            f"staleness mean {m['staleness/mean']:.2f} max {int(m['staleness/max'])}, "
            f"{m['rollout/calls_per_s']:.1f} calls/s, step {m['timing/step_s']:.1f} s {update}"
        )

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
            self.bar.close()

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
        rollouts, calls, flags, intermediate = await self.fetch(groups)
        base = state.version  # the policy the batch is trained against
        minibatch_rollouts = int(self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
        settings = self.agl.adapter(self.backend.dp_size, minibatch_rollouts)
        batch = build_batch(rollouts, calls, settings, version=base, intermediate=intermediate)
        self.check_temperature(batch, calls)
        state.step += 1
        state.trained.append([g.id for g in groups])
        state.groups = [g for g in state.groups if g not in groups]
        due = self.checkpoint_due()
        update = bool(batch.n_samples) or due
        started = time.monotonic()
        drained = started
        metrics: dict[str, float] = {}
        if update:
            await self.gw.pause()
            drained = time.monotonic()
            await asyncio.to_thread(self.backend.engine.sleep)
            if batch.n_samples:
                metrics = await asyncio.to_thread(self.backend.update, batch)
            state.version += 1
        metrics |= self.step_metrics(rollouts, calls, batch, base, settings) | flags
        metrics |= {
            "timing/drain_s": drained - started,
            "groups/carried_over": sum(g.version < base for g in groups),
        }
        state.history.append(metrics)
        paused_s = 0.0
        if update:
            checkpoint = None
            if due:
                checkpoint = await asyncio.to_thread(self.save)
            await self.publish(checkpoint)
            paused_s = time.monotonic() - started
        # after the checkpoint: its history has no pause time for this step
        metrics["timing/paused_s"] = paused_s
        self.tracker.log(data=metrics, step=state.step)
        self.progress(metrics)
        test_freq = self.cfg.trainer.test_freq
        if test_freq > 0 and state.step % test_freq == 0:
            await self.launch_validation()

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

    async def fetch(
        self, groups: list[Group]
    ) -> tuple[list[Rollout], dict[str, list[Call]], dict[str, float], dict[str, Counter[int]]]:
        """The rollouts, their calls, per `flag` event name (reward-hacking checks) the share with
        one, and per rollout and call seq the sum of the call's intermediate rewards (of the
        rollout's last attempt)."""
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
        return (
            rollouts,
            calls,
            {f"flags/{name}_rate": n / len(rollouts) for name, n in flags.items()},
            intermediate,
        )

    def step_metrics(
        self,
        rollouts: list[Rollout],
        calls: dict[str, list[Call]],
        batch: Batch,
        base: int,
        settings: AdapterSettings,
    ) -> dict[str, float]:
        """The adapter's metrics, and the batch's rewards, lengths, staleness and pace since the
        last step."""
        rewards = [r.reward or 0.0 for r in rollouts]
        staleness = [
            base - min((c.model_version for c in calls[r.id]), default=base) for r in rollouts
        ]
        lengths = [len(c.response_ids) for cs in calls.values() for c in cs]
        now = time.monotonic()
        elapsed = now - self.last_step_at
        self.last_step_at = now
        metrics = {f"adapter/{k}": float(v) for k, v in batch.metrics.items()}
        if batch.loss_mask.any():  # the behaviour policy's entropy, estimated from what it sampled
            metrics["rollout/sampled_entropy"] = -float(batch.logprobs[batch.loss_mask].mean())
        calls_per_rollout = 0.0
        if rollouts:
            calls_per_rollout = len(lengths) / len(rollouts)
        metrics |= {
            "reward/mean": mean(rewards),
            "response_length/mean": mean(lengths),
            "rollout/calls_per_rollout": calls_per_rollout,
            "staleness/mean": mean(staleness),
            "staleness/max": float(max(staleness, default=0)),
            "rollout/calls_per_s": len(lengths) / max(elapsed, 1e-9),
            "timing/step_s": elapsed,
            "version": float(self.state.version),
        }
        # calls per agent: calls/NAME/trained or calls/NAME/untrained, by the adapter's rule
        per_agent = Counter(
            (c.agent, settings.trains(c.agent)) for cs in calls.values() for c in cs
        )
        metrics |= {
            f"calls/{a}/{'trained' if t else 'untrained'}": float(n)
            for (a, t), n in per_agent.items()
        }
        return metrics | {
            f"staleness/count_{k}": float(staleness.count(k)) for k in sorted(set(staleness))
        }

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
        self.bar.write(
            f"validation at step {step} (version {version}): reward {reward:.3f} "
            f"({len(counted)} rollouts)"
        )
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
                await asyncio.to_thread(self.save, "best")
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
        await asyncio.to_thread(self.backend.load, self.dir / "best")
        state.version += 1
        await self.publish(self.dir / "best")

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

    # ------------------------------------------------------------------ checkpoints

    def save(self, name: str = "") -> Path:
        """step_N/{actor, model, state.json}, written aside and renamed; `latest` names it.
        With a `name` (the guard's `best`), that folder instead, and `latest` stays."""
        path = self.dir / (name or f"step_{self.state.step}")
        tmp = self.dir / f".{path.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.backend.save(tmp)
        (tmp / "state.json").write_text(self.state.to_json())
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        if not name:
            (self.dir / "latest.tmp").write_text(path.name)
            os.replace(self.dir / "latest.tmp", self.dir / "latest")
            # at least 2: the engine serves the newest
            keep = max(int(self.cfg.trainer.get("max_actor_ckpt_to_keep") or 2), 2)
            for old in sorted(self.dir.glob("step_*"), key=lambda p: int(p.name[5:]))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path

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
        latest = self.dir / "latest"
        checkpoint = None
        if latest.is_file() and self.cfg.trainer.resume_mode != "disable":
            checkpoint = self.dir / latest.read_text().strip()
            self.state = TrainerState.from_json((checkpoint / "state.json").read_text())
            self.bar.update(self.state.step)
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


def mean(values: Sequence[float]) -> float:
    """The values' mean; 0.0 when there are none."""
    if not values:
        return 0.0
    return float(np.mean(values))


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
