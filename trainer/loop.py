"""`agl train CONFIG [key=value ...]`: rollouts through unchanged harnesses become policy updates.

Owns the training loop of DESIGN.md section 7, its checkpoints and its progress output. It speaks only the
gateway's admin API (create rollouts carrying the spec the controller runs, read their status and calls, pause,
resume, register model versions); the backend (`trainer/backend.py`) owns the model and its engines. It launches
no harness (the controller does) and never opens the store. Groups are named `{experiment_name}/{index}`, so a
restarted run finds the groups it launched after its last checkpoint instead of launching them again.
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
from agl.types import JSON, Call, FailureKind, Mode, Rollout, Status
from trainer.config import AglConfig, ConfigError, load_config

if TYPE_CHECKING:
    from trainer.backend import Backend

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Group:
    id: str
    rollouts: list[str]
    version: int  # the model version when it was launched


def read_tasks(path: str, spec: JSON | None) -> list[JSON]:
    """One JSON object per line: a task (run with `agl.spec`), or `{"task", "spec", "grader"}` (its own spec)."""
    tasks = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not tasks or not all(isinstance(t, dict) for t in tasks):
        raise ConfigError(f"{path}: expected one JSON object per line")
    if spec is None and not all("spec" in t for t in tasks):
        raise ConfigError(f"{path}: a task without its own `spec` needs agl.spec")
    return tasks


STATE = (
    "step",
    "version",
    "cursor",
    "history",
    "trained",
    "best",
    "groups",
)  # the Trainer's checkpointed attributes


class Trainer:
    def __init__(
        self, cfg: DictConfig, agl: AglConfig, backend: "Backend", gw: GatewayClient, tracker: Any
    ) -> None:
        self.cfg, self.agl, self.backend, self.gw, self.tracker = cfg, agl, backend, gw, tracker
        self.name = str(cfg.trainer.experiment_name)
        self.dir = Path(cfg.trainer.default_local_dir)
        self.tasks = read_tasks(agl.tasks, agl.spec)
        random.Random(agl.seed).shuffle(
            self.tasks
        )  # the order is the seed's: a restart sees the same one
        self.val_tasks = read_tasks(agl.val_tasks, agl.spec) if agl.val_tasks else []
        self.steps = int(cfg.trainer.total_training_steps)
        self.step, self.version, self.cursor = 0, 0, 0
        self.groups: list[Group] = []  # launched, not yet trained on, in launch order
        self.val: list[Group] = []  # validation groups of the round out
        self.history: list[dict[str, float]] = []
        self.trained: list[
            list[str]
        ] = []  # the group IDs of each step: none trained twice, none lost
        self.best: float | None = None  # the best validation reward so far (the guard's)
        self.stopped = False  # by the guard
        self.last_step_at = time.monotonic()
        self.bar = tqdm(total=self.steps, desc="train", unit="step", dynamic_ncols=True)

    def progress(self, m: dict[str, float]) -> None:
        self.bar.update(self.step - self.bar.n)
        shown = {
            "reward": m["reward/mean"],
            "stale": m["staleness/mean"],
            "calls/s": m["rollout/calls_per_s"],
        }
        self.bar.set_postfix({k: f"{v:.2f}" for k, v in shown.items()})
        learned, update = "", "(no samples: no update)"
        if "timing/update_s" in m:
            learned = f"entropy {m['actor/entropy']:.3f}, kl {m['actor/kl_k3']:.4f}, "
            learned += f"grad norm {m['actor/grad_norm']:.2f}, "
            update = f"(update {m['timing/update_s']:.1f} s)"
        self.bar.write(
            f"step {self.step}: reward {m['reward/mean']:.3f} over {int(m['adapter/rollouts'])} rollouts "
            f"({m['adapter/degenerate_rate']:.0%} of groups degenerate), {learned}"
            f"staleness mean {m['staleness/mean']:.2f} max {int(m['staleness/max'])}, "
            f"{m['rollout/calls_per_s']:.1f} calls/s, step {m['timing/step_s']:.1f} s {update}"
        )

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Train until the last step (or the guard stops it); no update while a validation round is out."""
        await self.restore()
        try:
            if self.step == 0 and self.cfg.trainer.get("val_before_train"):
                await self.launch_validation()
            while self.step < self.steps and not self.stopped:
                await self.launch_groups()
                ready = [g for g in self.groups if await self.ended([g]) is not None]
                needed = self.agl.batch_groups if self.agl.mode == "async" else len(self.groups)
                if await self.finish_validation() and not self.stopped and len(ready) >= needed:
                    await self.train_step(ready[: self.agl.batch_groups])
                else:
                    await asyncio.sleep(self.agl.poll_s)
            if (
                not self.stopped and not self.val
            ):  # the final validation, unless the last step launched it
                await self.launch_validation()
            while not await self.finish_validation():
                await asyncio.sleep(self.agl.poll_s)
        finally:
            with contextlib.suppress(GatewayError):
                await self.cancel_unfinished()
            self.bar.close()

    async def cancel_unfinished(self) -> None:
        """The run is over: end the rollouts still running (their harnesses get 403 and stop)."""
        for r in await self.members(self.groups + self.val):
            if not r.status.terminal:
                with contextlib.suppress(GatewayError):  # it ended meanwhile
                    await self.gw.set_status(r.id, Status.CANCELLED, reason="training finished")

    async def launch_groups(self) -> None:
        """Async: keep `active_groups` running. Sync: launch `batch_groups` once the last batch is trained."""
        want = (
            self.agl.active_groups
            if self.agl.mode == "async"
            else (0 if self.groups else self.agl.batch_groups)
        )
        while len(self.groups) < want:
            await self.launch_next()

    async def launch_next(self, known: Sequence[str] = ()) -> None:
        """The next task's group, `{experiment_name}/{cursor}`: `agl.n` rollouts, of which `known` exist already."""
        entry = self.tasks[self.cursor % len(self.tasks)]
        group = await self.launch(
            f"{self.name}/{self.cursor}", entry, self.agl.n - len(known), Mode.TRAIN, None
        )
        group.rollouts[:0] = known
        self.groups.append(group)
        self.cursor += 1

    async def launch(
        self, group: str, entry: JSON, n: int, mode: Mode, sampling: JSON | None
    ) -> Group:
        """`n` rollouts of one task entry: the task itself, or `{"task", "spec", "grader"}`."""
        task, spec = (
            (entry.get("task", {}), entry["spec"]) if "spec" in entry else (entry, self.agl.spec)
        )
        meta = {"spec": spec, "trainer": self.name}
        create = partial(
            self.gw.create_rollout,
            task,
            group,
            mode=mode,
            grader=entry.get("grader"),
            metadata=meta,
        )
        return Group(
            group, [(await create(sampling=sampling))["id"] for _ in range(n)], self.version
        )

    async def members(self, groups: list[Group]) -> list[Rollout]:
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
        return listed if done else None

    async def train_step(self, groups: list[Group]) -> None:
        """Batch -> pause (drained) -> sleep -> update -> save -> push -> wake -> register -> resume. A batch
        without samples (every group's rewards equal, or its rollouts stale or failed) makes a step without an
        update: nothing is paused or pushed and the version stays, unless a checkpoint is due."""
        rollouts, calls, flags, intermediate = await self.fetch(
            groups
        )  # ended: built while harnesses still run
        base = self.version  # the policy the batch is trained against
        settings = self.agl.adapter(
            self.backend.dp_size, int(self.cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
        )
        batch = build_batch(rollouts, calls, settings, version=base, intermediate=intermediate)
        self.check_temperature(batch, calls)
        self.step += 1
        self.trained.append([g.id for g in groups])
        self.groups = [g for g in self.groups if g not in groups]
        freq = int(self.cfg.trainer.save_freq)
        due = (freq > 0 and self.step % freq == 0) or (
            freq >= 0 and self.step == self.steps
        )  # and the last
        update = bool(batch.n_samples) or due
        started = drained = time.monotonic()
        metrics: dict[str, float] = {}
        if update:
            await self.gw.pause()
            drained = time.monotonic()
            self.backend.engine.sleep()
            metrics = await asyncio.to_thread(self.backend.update, batch) if batch.n_samples else {}
            self.version += 1
        metrics |= self.step_metrics(rollouts, calls, batch, base, settings) | flags
        metrics |= {
            "timing/drain_s": drained - started,
            "groups/carried_over": sum(g.version < base for g in groups),
        }
        self.history.append(metrics)
        if update:
            await self.publish(await asyncio.to_thread(self.save) if due else None)
        metrics["timing/paused_s"] = time.monotonic() - started if update else 0.0
        self.tracker.log(data=metrics, step=self.step)
        self.progress(metrics)
        if self.cfg.trainer.test_freq > 0 and self.step % self.cfg.trainer.test_freq == 0:
            await self.launch_validation()

    def check_temperature(self, batch: Batch, calls: dict[str, list[Call]]) -> None:
        """Calls sampled at another temperature than `agl.temperature` were not trained (their log-probs are
        of another distribution); when that is every call, the config is wrong."""
        m = batch.metrics
        if not m["calls_temperature_mismatch"]:
            return
        seen = sorted(
            {c.temperature for cs in calls.values() for c in cs}, key=lambda t: (t is None, t or 0)
        )
        if m["calls_temperature_mismatch"] == m["calls"] - m["calls_untrained"]:
            raise ConfigError(
                f"agl.temperature={self.agl.temperature} matches none of the batch's {int(m['calls'])} calls "
                f"(sampled at {', '.join(map(str, seen))}); set it to the temperature the harnesses sample at"
            )
        log.warning(
            "%d of %d calls were sampled at a temperature other than agl.temperature=%s (seen: %s): not trained",
            m["calls_temperature_mismatch"], m["calls"], self.agl.temperature, seen,
        )  # fmt: skip

    async def fetch(
        self, groups: list[Group]
    ) -> tuple[list[Rollout], dict[str, list[Call]], dict[str, float], dict[str, Counter[int]]]:
        """The rollouts, their calls, per `flag` event name (reward-hacking checks) the share with one, and per
        rollout and call seq the sum of the call's intermediate rewards (of the rollout's last attempt)."""
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
        """The adapter's metrics, and the batch's rewards, lengths, staleness and pace since the last step."""
        rewards = [r.reward or 0.0 for r in rollouts]
        staleness = [
            base - min((c.model_version for c in calls[r.id]), default=base) for r in rollouts
        ]
        lengths = [len(c.response_ids) for cs in calls.values() for c in cs]
        now = time.monotonic()
        elapsed, self.last_step_at = now - self.last_step_at, now
        metrics = {f"adapter/{k}": float(v) for k, v in batch.metrics.items()}
        if batch.loss_mask.any():  # the behaviour policy's entropy, estimated from what it sampled
            metrics["rollout/sampled_entropy"] = -float(batch.logprobs[batch.loss_mask].mean())
        metrics |= {
            "reward/mean": float(np.mean(rewards)) if rewards else 0.0,
            "response_length/mean": float(np.mean(lengths)) if lengths else 0.0,
            "rollout/calls_per_rollout": len(lengths) / len(rollouts) if rollouts else 0.0,
            "staleness/mean": float(np.mean(staleness)) if staleness else 0.0,
            "staleness/max": float(max(staleness, default=0)),
            "rollout/calls_per_s": len(lengths) / max(elapsed, 1e-9),
            "timing/step_s": elapsed,
            "version": float(self.version),
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
        """A round of `val_kwargs.n` rollouts per validation task (greedy unless `val_kwargs.do_sample`);
        no update happens until it has ended, so the whole round is served by one version."""
        if not self.val_tasks:
            return
        kw = self.cfg.actor_rollout_ref.rollout.val_kwargs
        sampling = {"temperature": 0.0}  # greedy
        if kw.do_sample:
            sampling = {"temperature": float(kw.temperature), "top_p": kw.top_p, "top_k": kw.top_k}
        self.val = [
            await self.launch(
                f"{self.name}/val{self.step}/{i}", task, int(kw.n), Mode.VAL, sampling
            )
            for i, task in enumerate(self.val_tasks)
        ]

    async def finish_validation(self) -> bool:
        """Once every rollout of the round has ended: log its mean reward (infra failures aside) and
        apply the guard. True when no round is out."""
        if not self.val:
            return True
        if (rollouts := await self.ended(self.val)) is None:
            return False
        counted = [
            r
            for r in rollouts
            if r.failure_kind is not FailureKind.INFRA and r.status is not Status.CANCELLED
        ]
        reward = float(np.mean([r.reward or 0.0 for r in counted])) if counted else 0.0
        m = {
            "val/reward_mean": reward,
            "val/step": float(self.step),
            "val/version": float(self.version),
        }
        self.tracker.log(data=m | {"val/rollouts": float(len(counted))}, step=self.step)
        self.history.append(m)
        self.val = []
        self.bar.write(
            f"validation at step {self.step} (version {self.version}): reward {reward:.3f} ({len(counted)} rollouts)"
        )
        await self.guard(reward)
        return True

    async def guard(self, reward: float) -> None:
        """Keep the best validated weights (for `restore`); act when reward falls `guard_drop` below the best."""
        drop, action = self.agl.guard_drop, self.agl.guard_action
        if drop is None:
            return
        if self.best is None or reward > self.best:
            self.best = reward
            if action == "restore":
                await asyncio.to_thread(self.save, "best")
            return
        if reward > self.best - drop:
            return
        self.history.append(
            {"guard/step": float(self.step), "guard/best": self.best, "guard/reward": reward}
        )
        self.tracker.log(data={"guard/triggered": 1.0}, step=self.step)
        log.warning(
            "validation reward %.3f is more than %.3f below its best, %.3f: %s",
            reward,
            drop,
            self.best,
            action,
        )
        if action == "stop":
            self.stopped = True
            return
        await self.gw.pause()
        self.backend.engine.sleep()
        await asyncio.to_thread(self.backend.load, self.dir / "best")
        self.version += 1
        await self.publish(self.dir / "best")

    async def publish(self, path: Path | None) -> None:
        """The paused gateway resumes on `self.version`: weights pushed (saved at `path`), engines awake, registered."""
        await asyncio.to_thread(self.backend.engine.push, path, self.version)
        self.backend.engine.wake()
        await self.gw.register_model(
            self.version, path=str(path or ""), endpoints=self.backend.engine.endpoints()
        )
        await self.gw.resume(self.version)

    # ------------------------------------------------------------------ checkpoints

    def save(self, name: str = "") -> Path:
        """step_N/{actor, model, state.json}, written aside and renamed; `latest` names it.
        With a `name` (the guard's `best`), that folder instead, and `latest` stays."""
        path = self.dir / (name or f"step_{self.step}")
        tmp = self.dir / f".{path.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.backend.save(tmp)
        (tmp / "state.json").write_text(
            json.dumps({k: getattr(self, k) for k in STATE}, default=dataclasses.asdict)
        )
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        if not name:
            (self.dir / "latest.tmp").write_text(path.name)
            os.replace(self.dir / "latest.tmp", self.dir / "latest")
            keep = max(
                int(self.cfg.trainer.get("max_actor_ckpt_to_keep") or 2), 2
            )  # the engine serves the newest
            for old in sorted(self.dir.glob("step_*"), key=lambda p: int(p.name[5:]))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path

    async def wait_for_gateway(self, timeout_s: float = 900) -> JSON:
        """The gateway's state, once it answers (on GPUs it starts after the engines this trainer made)."""
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
        """Continue from the latest checkpoint, adopting groups launched after it. Whenever a version was served
        before, the engines get the trainer's weights again, as a new version if updates after the checkpoint
        (or with no checkpoint, every update) were lost: what they serve is then what the trainer holds."""
        registered = (await self.wait_for_gateway()).get(
            "latest_model"
        )  # only this trainer registers versions
        latest = self.dir / "latest"
        checkpoint = None
        if latest.is_file() and self.cfg.trainer.resume_mode != "disable":
            checkpoint = self.dir / latest.read_text().strip()
            state = json.loads((checkpoint / "state.json").read_text())
            for key in STATE:
                setattr(self, key, state.get(key))
            self.groups = [Group(**g) for g in state["groups"]]
            self.bar.update(self.step)
        if (
            registered and registered["version"] > self.version
        ):  # updates after the checkpoint were lost:
            self.version = (
                registered["version"] + 1
            )  # the trainer's weights are served again, as a new version
        if checkpoint is not None or registered:
            self.backend.engine.sleep()  # first: sglang holds its share of the GPUs' memory until it sleeps
            if checkpoint is not None:
                await asyncio.to_thread(self.backend.load, checkpoint)
            await asyncio.to_thread(self.backend.engine.push, checkpoint, self.version)
            self.backend.engine.wake()
            log.info(
                "resumed from %s: step %d, version %d",
                checkpoint or "the base weights",
                self.step,
                self.version,
            )
        if not registered or registered["version"] < self.version:
            await self.gw.register_model(self.version, endpoints=self.backend.engine.endpoints())
        await self.gw.resume(self.version)
        # groups launched after the checkpoint (or before a crash that left none): the cursor names them
        while found := await self.gw.list_rollouts(
            group=f"{self.name}/{self.cursor}", limit=self.agl.n + 1
        ):
            await self.launch_next([r.id for r in found])


async def train(cfg: DictConfig, agl: AglConfig) -> list[dict[str, float]]:
    from verl.utils.tracking import Tracking

    from trainer.backend import Backend  # verl, Ray, torch: only once training starts
    from trainer.engines import engine_http

    out = Path(cfg.trainer.default_local_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_path = str(cfg.actor_rollout_ref.model.get("path") or "")
    if agl.engine and (not model_path or model_path.startswith("~/models")):  # verl's placeholder
        # the model the engine served when the run began: training starts there and the KL's reference is it
        first = out / "base_model"
        if first.is_file() and cfg.trainer.resume_mode != "disable":
            model_path = first.read_text().strip()
        else:
            with engine_http(30) as http:
                model_path = http.get(f"{agl.engine}/model_info").json()["model_path"]
            first.write_text(model_path)
        cfg.actor_rollout_ref.model.path = (
            model_path  # verl's config has the key: no open_dict needed
        )
    backend = Backend(cfg, agl)
    (out / "engines.txt").write_text(
        ",".join(backend.engine.endpoints()) + "\n"
    )  # for `agl gateway --engine-url`
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
        (out / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in loop.history))
        return loop.history
    finally:
        backend.close()
        del tracker


def main(argv: list[str]) -> int:
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
    except (
        ConfigError
    ) as e:  # also one found once calls are seen (a temperature none was sampled at)
        parser.error(str(e))
    return 0
