"""`agl controller`: the reconcile loop between the gateway's queued rollouts and a launcher.

- Owns which rollout runs when (caps on runs at once and on the launch rate, retry backoff) and
  fresh tokens per attempt (plaintext tokens exist only in the reply that issues them).
- Records each end as `outcome.py` builds it: a final reward -> `succeeded`; none, or harness
  exit != 0 -> `failed` (task); timeout -> `timed_out`; infra (launch error, lost run, deleted
  Job, evicted pod, grader failure, a task failure across a gateway restart) -> `queued` as
  attempt + 1 after a backoff, up to `max_attempts` (`retry_or_end`).
- Runs `metadata.spec`, else `--spec`, else leaves the rollout alone; adopts `agl jobs render`'s
  Jobs by label.
- Each launch is recorded in a `launch` event naming the launcher: how a restarted controller
  tells its own lost runs. A run whose rollout ended elsewhere (a cancel) is stopped.
- Stopping the controller leaves runs alive.
"""

import asyncio
import contextlib
import logging
import signal
import time

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agl.client import GatewayClient, GatewayError
from agl.settings import from_flags, usage_error
from agl.types import JSON, Rollout, Status
from controller.launcher import AttemptKey, Credentials, Launcher, LaunchError, LocalLauncher
from controller.outcome import TASK, Outcome, across_restart, retry_or_end, rewarded
from controller.spec import Spec, SpecError, load_spec, parse_spec

log = logging.getLogger(__name__)


class ControllerSettings(BaseSettings):
    """The controller: `AGL_CONTROLLER_<FIELD>` in the environment, each overridden by its flag."""

    model_config = SettingsConfigDict(env_prefix="AGL_CONTROLLER_", extra="forbid")

    gateway: str = Field(
        "http://127.0.0.1:8000", description="Gateway URL (admin API and what runs call)."
    )
    admin_key: str = Field(
        "", description="The gateway's admin key (required); never passed to runs."
    )
    launcher: str = Field("local", pattern="^(local|kubernetes)$", description="Where runs go.")
    spec: str = Field("", description="Default spec file for rollouts without metadata.spec.")
    state_dir: str = Field(
        "agl-controller", description="Local launcher: state files and logs (directory)."
    )
    namespace: str = Field(
        "default", description="Kubernetes namespace watched for this controller's Jobs."
    )
    max_running: int = Field(
        64, ge=1, description="Runs at once (count): what the machine or quota holds."
    )
    launch_per_s: float = Field(
        20.0, gt=0, description="Launch-rate cap (per second): spares the API server."
    )
    poll_s: float = Field(
        0.5, gt=0, description="Reconcile period (seconds): latency of noticing an end."
    )


def applied(rollout: Rollout) -> bool:
    """Whether the attempt is an applied Job's (`agl jobs render`'s attempt 1), which no
    controller launches."""
    return rollout.attempt == 1 and rollout.metadata.get("launch") == "manifest"


def attempt_key(rollout: Rollout) -> AttemptKey:
    """The rollout's current attempt."""
    return AttemptKey(rollout_id=rollout.id, attempt=rollout.attempt)


def retry_delay(rollout: Rollout, spec: Spec | None) -> float | None:
    """Seconds before the rollout's next attempt may start (the backoff doubles per attempt), or
    None if it has had all its attempts (one, without a spec)."""
    if spec is None or rollout.attempt >= spec.max_attempts:
        return None
    return spec.retry_backoff_s * 2 ** (rollout.attempt - 1)


class Controller:
    """Reconciles the gateway's queued rollouts with `launcher`'s runs."""

    def __init__(
        self, gw: GatewayClient, launcher: Launcher, spec: Spec | None, settings: ControllerSettings
    ) -> None:
        self.gw = gw
        self.launcher = launcher
        self.spec = spec
        self.settings = settings
        self.not_before: dict[str, float] = {}  # rollout id -> monotonic time its retry may start
        self.started: set[AttemptKey] = set()  # attempts launched or adopted and not yet recorded
        # Launches allowed now; refills at launch_per_s, up to it.
        self.launch_budget = settings.launch_per_s
        self.refilled = time.monotonic()
        # The gateway's `end_seq` of the last ended rollout this loop has looked at.
        self.ends_seen = 0

    async def run(self, stop: asyncio.Event) -> None:
        """The loop: adopt once, then record ended runs and launch queued rollouts until `stop`."""
        # Once: a retry would start a second Kubernetes watch.
        self.started = set(await self.launcher.adopt())
        adopted = False
        while not stop.is_set():
            try:
                if not adopted:  # the gateway may be down when the controller starts: retried
                    await self.adopt()
                    adopted = True
                ended = await self.launcher.poll()
                await asyncio.gather(*(self.record(key, outcome) for key, outcome in ended))
                await self.stop_ended()
                await self.launch_queued()
            except GatewayError as e:  # the gateway is down or restarting: retry next tick
                log.warning("reconcile: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.poll_s)

    async def adopt(self) -> None:
        """Runs not found (lost in a restart, an applied Job gone) are infra failures; runs found
        whose rollout ended (or moved on) are stopped."""
        self.ends_seen = int((await self.gw.state())["last_end"])  # later ends: `stop_ended`
        running = await self.gw.list_rollouts(status=Status.RUNNING, limit=10_000)
        await self.stop_moved_on(running)
        adopted = {key.rollout_id for key in self.started}
        for rollout in running:
            if rollout.id not in adopted and await self.launched_here(rollout):
                lost = Outcome.lost("the run was not found when the controller started")
                await self.report(rollout, lost, self.spec_of(rollout))

    async def stop_moved_on(self, running: list[Rollout]) -> None:
        """Stop the adopted runs whose rollout ended, or moved on to another attempt, while no
        controller watched."""
        current = {attempt_key(rollout) for rollout in running}
        # Not running: queued (a Job yet to start), or ended.
        for key in self.started - current:
            rollout = await self.find(key.rollout_id)
            if rollout and (rollout.status.terminal or rollout.attempt != key.attempt):
                await self.launcher.stop(key)

    async def launched_here(self, rollout: Rollout) -> bool:
        """Whether this controller's launcher runs the rollout's current attempt: a `launch` event
        of that attempt names it, or the attempt is an applied Job in the namespace it watches."""
        if self.applied_here(rollout):
            return True
        for event in await self.gw.events(rollout.id):
            if event["attempt"] == rollout.attempt and self.launched_by_me(event):
                return True
        return False

    def launched_by_me(self, event: JSON) -> bool:
        """Whether the event is a launch by this controller's kind of launcher (`mark_launched`)."""
        if event["kind"] != "launch":
            return False
        return event["data"].get("launcher") == self.settings.launcher

    def applied_here(self, rollout: Rollout) -> bool:
        """An applied Job's attempt (`agl jobs render`) in the namespace this Kubernetes launcher
        watches."""
        if not applied(rollout) or self.settings.launcher != "kubernetes":
            return False
        spec = self.spec_of(rollout)
        return spec is not None and spec.namespace == self.settings.namespace

    async def stop_ended(self) -> None:
        """Stop the runs of rollouts that ended without this controller: cancelled, or ended by an
        admin."""
        for rollout in await self.gw.list_rollouts(after=self.ends_seen, limit=1000):
            self.ends_seen = rollout.end_seq or self.ends_seen
            key = attempt_key(rollout)
            if key in self.started:
                log.info(
                    "rollout_id=%s attempt=%d: %s elsewhere; its run is stopped",
                    rollout.id,
                    rollout.attempt,
                    rollout.status,
                )
                await self.launcher.stop(key)

    def spec_of(self, rollout: Rollout) -> Spec | None:
        """The rollout's own spec (`metadata.spec`), else the controller's `--spec`."""
        if "spec" in rollout.metadata:
            return parse_spec(rollout.metadata["spec"], f"rollout {rollout.id} metadata.spec")
        return self.spec

    async def launch_queued(self) -> None:
        """Launch as many queued rollouts as the launch budget and `max_running` allow."""
        now = time.monotonic()
        rate = self.settings.launch_per_s
        self.launch_budget = min(rate, self.launch_budget + (now - self.refilled) * rate)
        self.refilled = now
        room = min(int(self.launch_budget), self.settings.max_running - self.launcher.active())
        if room < 1:
            return
        queued = await self.gw.list_rollouts(
            status=Status.QUEUED, limit=2 * self.settings.max_running + 100
        )
        chosen = [r for r in queued if self.launchable(r)][:room]
        self.launch_budget -= len(chosen)
        await asyncio.gather(*(self.start(r) for r in chosen))

    def launchable(self, r: Rollout) -> bool:
        """Not started, past its backoff, ours (another's would take our place), not an applied
        Job's attempt 1."""
        if attempt_key(r) in self.started or self.not_before.get(r.id, 0) > time.monotonic():
            return False
        return not applied(r) and (self.spec is not None or "spec" in r.metadata)

    async def start(self, rollout: Rollout) -> None:
        """Launch the rollout's current attempt with fresh tokens; a bad spec is a task failure, a
        launch error as `LaunchError` says."""
        self.not_before.pop(rollout.id, None)
        try:
            spec = self.spec_of(rollout)
            assert spec is not None  # launchable() chose only rollouts with one
            if spec.grader and not rollout.has_grader:
                raise SpecError("the spec has a grader but the rollout has no grader token")
        except SpecError as e:
            await self.report(rollout, Outcome.launch_failed(str(e), permanent=True), None)
            return
        try:
            reply = await self.gw.rotate_tokens(rollout.id, attempt=rollout.attempt)
        except GatewayError as e:
            log.warning(
                "rollout_id=%s: no tokens for attempt %d: %s", rollout.id, rollout.attempt, e
            )
            return
        creds = Credentials.from_reply(reply, rollout.attempt, rollout.task)
        try:
            where = await self.launcher.launch(spec, creds)
        except LaunchError as e:
            log.warning(
                "rollout_id=%s attempt=%d: launch failed: %s", rollout.id, rollout.attempt, e
            )
            await self.report(rollout, Outcome.launch_failed(str(e), permanent=e.permanent), spec)
            return
        self.started.add(attempt_key(rollout))
        await self.mark_launched(rollout, where)
        log.info("rollout_id=%s attempt=%d: launched (%s)", rollout.id, rollout.attempt, where)

    async def mark_launched(self, rollout: Rollout, where: str) -> None:
        """Record that this launcher runs the attempt: a `launch` event naming it (what a restarted
        controller looks for, `launched_by_me`), then `running`, unless the harness's first call
        came first."""
        launch = {"launcher": self.settings.launcher, "where": where}
        await self.gw.post_event(rollout.id, "launch", launch)
        reason = f"launched by {self.settings.launcher}: {where}"
        await self.set_status(rollout, Status.RUNNING, None, reason)

    async def record(self, key: AttemptKey, outcome: Outcome) -> None:
        """Report an ended attempt; release it once the gateway has it (or it is stale)."""
        rollout = await self.find(key.rollout_id)
        if rollout and rollout.attempt == key.attempt and not rollout.status.terminal:
            await self.report(rollout, outcome, self.spec_of(rollout))
        await self.launcher.release(key)
        self.started.discard(key)

    async def find(self, rollout_id: str) -> Rollout | None:
        """The rollout, or None if the gateway has none by that id (a Job of another gateway's)."""
        try:
            return await self.gw.get_rollout(rollout_id)
        except GatewayError as e:
            if e.status != 404:
                raise
            return None

    async def report(self, rollout: Rollout, outcome: Outcome, spec: Spec | None) -> None:
        """Record how the attempt ended, once its final reward is known; an infra failure is
        retried as the next attempt while the spec allows."""
        outcome = rewarded(outcome, rollout.reward)
        # Only a task failure can be the restart's doing: the others need no health check.
        if outcome.failure_kind == TASK and await self.gateway_restarted_during(rollout):
            outcome = across_restart(outcome)
        delay = retry_delay(rollout, spec)
        outcome = retry_or_end(outcome, attempts_left=delay is not None)
        status = Status(outcome.status)
        if delay is not None and status is Status.QUEUED:
            self.not_before[rollout.id] = time.monotonic() + delay
        elif rollout.status is Status.QUEUED and status is not Status.FAILED:
            await self.set_status(rollout, Status.RUNNING, None, "started by the controller")
        await self.set_status(rollout, status, outcome.failure_kind, outcome.reason)
        log.info(
            "rollout_id=%s attempt=%d: %s %s %s",
            rollout.id,
            rollout.attempt,
            status,
            outcome.failure_kind or "",
            outcome.reason,
        )

    async def gateway_restarted_during(self, rollout: Rollout) -> bool:
        """Whether the gateway restarted since the rollout started (both on its clock): a task
        failure may then be its doing."""
        if not rollout.started_at:
            return False
        return float((await self.gw.health())["started_at"]) > rollout.started_at

    async def set_status(self, r: Rollout, status: Status, kind: str | None, reason: str) -> bool:
        """Move the rollout's current attempt; False if someone else moved it first (a cancel, the
        harness's first call)."""
        try:
            await self.gw.set_status(
                r.id, status, failure_kind=kind, reason=reason, attempt=r.attempt
            )
        except GatewayError as e:
            if e.status != 409:
                raise
            log.info("rollout_id=%s: status %s not recorded: %s", r.id, status, e.message)
            return False
        return True


def main(argv: list[str]) -> int:
    settings = from_flags(ControllerSettings, argv, "agl controller")
    if not settings.admin_key:
        usage_error(
            "agl controller", "an admin key is required: --admin-key or AGL_CONTROLLER_ADMIN_KEY"
        )
    spec = None
    try:
        if settings.spec:
            spec = load_spec(settings.spec)
    except SpecError as e:
        usage_error("agl controller", str(e))
    return asyncio.run(serve(settings, spec))


async def serve(settings: ControllerSettings, spec: Spec | None) -> int:
    """Run the controller until SIGTERM or SIGINT; its runs are left alive."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    if settings.launcher == "kubernetes":
        from controller import kube

        try:
            launcher: Launcher = kube.KubeLauncher(settings.namespace)
        except kube.config.ConfigException as e:  # no kubeconfig, and not in a pod
            usage_error(
                "agl controller",
                f"no Kubernetes cluster to use ({e}): set KUBECONFIG, or run in a pod",
            )
    else:
        launcher = LocalLauncher(settings.state_dir)
    async with GatewayClient(settings.gateway, settings.admin_key) as gw:
        log.info("controller: %s launcher, gateway %s", settings.launcher, settings.gateway)
        await Controller(gw, launcher, spec, settings).run(stop)
    return 0
