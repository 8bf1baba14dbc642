"""`agl controller`: the reconcile loop between the gateway's queued rollouts and a launcher.

Owns which rollout runs when (caps on runs at once and on the launch rate, retry backoff), fresh
tokens per attempt (plaintext tokens exist only in the reply that issues them) and the status of
each end: a final reward -> `succeeded`; none, or harness exit != 0 -> `failed` (task); timeout ->
`timed_out`; infra (launch error, lost run, deleted Job, evicted pod, grader failure, a task failure
across a gateway restart) -> `queued` as attempt + 1 after a backoff, up to `max_attempts`. Runs
`metadata.spec`, else `--spec`, else leaves the rollout alone; adopts `agl jobs render`'s Jobs by
label. A run whose rollout ended elsewhere (a cancel) is stopped. Stopping the controller leaves runs alive.
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
from agl.types import FailureKind, Rollout, Status
from controller.launcher import Credentials, Key, Launcher, LaunchError, LocalLauncher, Outcome
from controller.spec import Spec, SpecError, load_spec, parse_spec

log = logging.getLogger(__name__)
LAUNCHED = (
    "launched by"  # the reason of the `running` transition: how a restart finds its lost runs
)


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
    """Whether the attempt is an applied Job's (`agl jobs render`'s attempt 1), which no controller launches."""
    return rollout.attempt == 1 and rollout.metadata.get("launch") == "manifest"


class Controller:
    def __init__(
        self, gw: GatewayClient, launcher: Launcher, spec: Spec | None, settings: ControllerSettings
    ) -> None:
        self.gw, self.launcher, self.spec, self.settings = gw, launcher, spec, settings
        self.not_before: dict[str, float] = {}  # rollout id -> monotonic time its retry may start
        self.started: set[Key] = set()  # attempts launched or adopted and not yet recorded
        self.launch_budget = (
            settings.launch_per_s
        )  # launches allowed now; refills at launch_per_s, up to it
        self.refilled = time.monotonic()
        self.ends_seen = (
            0  # the gateway's `end_seq` of the last ended rollout this loop has looked at
        )

    async def run(self, stop: asyncio.Event) -> None:
        """The loop: adopt once, then record ended runs and launch queued rollouts until `stop`."""
        adopted, self.started = (
            False,
            set(await self.launcher.adopt()),
        )  # once: a retry would start a 2nd kube watch
        while not stop.is_set():
            try:
                if not adopted:  # the gateway may be down when the controller starts: retried
                    await self.adopt()
                    adopted = True
                await asyncio.gather(
                    *(self.record(key, outcome) for key, outcome in await self.launcher.poll())
                )
                await self.stop_ended()
                await self.launch_queued()
            except GatewayError as e:  # the gateway is down or restarting: retry next tick
                log.warning("reconcile: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.poll_s)

    async def adopt(self) -> None:
        """Runs not found (lost in a restart, an applied Job gone) are infra failures; runs found whose rollout
        ended (or moved on) are stopped."""
        self.ends_seen = int((await self.gw.state())["last_end"])  # later ends: `stop_ended`
        adopted, mine = {rid for rid, _ in self.started}, f"{LAUNCHED} {self.settings.launcher}:"
        running = await self.gw.list_rollouts(status=Status.RUNNING, limit=10_000)
        for key in self.started - {
            (r.id, r.attempt) for r in running
        }:  # queued (a Job yet to start), or ended
            rollout = await self.find(key[0])
            if rollout and (rollout.status.terminal or rollout.attempt != key[1]):
                await self.launcher.stop(key)
        for rollout in [r for r in running if r.id not in adopted]:
            events = [
                e for e in await self.gw.events(rollout.id) if e["attempt"] == rollout.attempt
            ]
            if any(
                str(e["data"].get("reason", "")).startswith(mine) for e in events
            ) or self.applied_here(rollout):
                lost = Outcome.infra("the run was not found when the controller started")
                await self.report(rollout, lost, self.spec_of(rollout))

    def applied_here(self, rollout: Rollout) -> bool:
        """An applied Job's attempt (`agl jobs render`) in the namespace this Kubernetes launcher watches."""
        spec = (
            self.spec_of(rollout)
            if applied(rollout) and self.settings.launcher == "kubernetes"
            else None
        )
        return spec is not None and spec.namespace == self.settings.namespace

    async def stop_ended(self) -> None:
        """Stop the runs of rollouts that ended without this controller: cancelled, or ended by an admin."""
        for rollout in await self.gw.list_rollouts(after=self.ends_seen, limit=1000):
            self.ends_seen = rollout.end_seq or self.ends_seen
            if (key := (rollout.id, rollout.attempt)) in self.started:
                log.info(
                    "rollout_id=%s attempt=%d: %s elsewhere; its run is stopped",
                    *key,
                    rollout.status,
                )
                await self.launcher.stop(key)

    def spec_of(self, rollout: Rollout) -> Spec | None:
        if "spec" in rollout.metadata:
            return parse_spec(rollout.metadata["spec"], f"rollout {rollout.id} metadata.spec")
        return self.spec

    async def launch_queued(self) -> None:
        now, rate = time.monotonic(), self.settings.launch_per_s
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
        """Not started, past its backoff, ours (another's would take our place), not an applied Job's attempt 1."""
        if (r.id, r.attempt) in self.started or self.not_before.get(r.id, 0) > time.monotonic():
            return False
        return not applied(r) and (self.spec is not None or "spec" in r.metadata)

    async def start(self, rollout: Rollout) -> None:
        self.not_before.pop(rollout.id, None)
        try:
            spec = self.spec_of(rollout)
            assert spec is not None  # launchable() chose only rollouts with one
            if spec.grader and not rollout.has_grader:
                raise SpecError("the spec has a grader but the rollout has no grader token")
        except SpecError as e:
            await self.report(rollout, Outcome.task(str(e)), None)
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
            await self.report(
                rollout, Outcome.task(str(e)) if e.permanent else Outcome.infra(str(e)), spec
            )
            return
        self.started.add((rollout.id, rollout.attempt))
        reason = f"{LAUNCHED} {self.settings.launcher}: {where}"
        if not await self.set_status(
            rollout, Status.RUNNING, None, reason
        ):  # its first call came first
            await self.gw.post_event(rollout.id, "launch", {"reason": reason})
        log.info("rollout_id=%s attempt=%d: launched (%s)", rollout.id, rollout.attempt, where)

    async def record(self, key: Key, outcome: Outcome) -> None:
        """Report an ended attempt; release it once the gateway has it (or it is stale)."""
        rollout = await self.find(key[0])
        if rollout and rollout.attempt == key[1] and not rollout.status.terminal:
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
        status, kind, reason = outcome.status, outcome.failure_kind, outcome.reason
        if status is Status.SUCCEEDED and rollout.reward is None:
            status, kind, reason = (
                Status.FAILED,
                FailureKind.TASK,
                "the run ended without a final reward",
            )
        if (
            kind is FailureKind.TASK
            and rollout.started_at
            and await self.gateway_restarted_since(rollout.started_at)
        ):
            status, kind, reason = (
                Status.FAILED,
                FailureKind.INFRA,
                f"{reason}; the gateway restarted during the run",
            )
        if kind is FailureKind.INFRA and rollout.attempt < (spec.max_attempts if spec else 1):
            status = Status.QUEUED
            backoff = (spec.retry_backoff_s if spec else 0) * 2 ** (rollout.attempt - 1)
            self.not_before[rollout.id] = time.monotonic() + backoff
        elif rollout.status is Status.QUEUED and status is not Status.FAILED:
            await self.set_status(rollout, Status.RUNNING, None, "started by the controller")
        await self.set_status(rollout, status, kind, reason)
        log.info(
            "rollout_id=%s attempt=%d: %s %s %s",
            rollout.id,
            rollout.attempt,
            status,
            kind or "",
            reason,
        )

    async def gateway_restarted_since(self, started_at: float) -> bool:
        """Whether the gateway restarted since `started_at` (its clock): a task failure may then be its doing."""
        return float((await self.gw.health())["started_at"]) > started_at

    async def set_status(
        self, r: Rollout, status: Status, kind: FailureKind | None, reason: str
    ) -> bool:
        try:
            await self.gw.set_status(
                r.id, status, failure_kind=kind, reason=reason, attempt=r.attempt
            )
        except GatewayError as e:
            if (
                e.status != 409
            ):  # 409: someone else moved it first (a cancel, the harness's first call)
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
    try:
        spec = load_spec(settings.spec) if settings.spec else None
    except SpecError as e:
        usage_error("agl controller", str(e))
    return asyncio.run(serve(settings, spec))


async def serve(settings: ControllerSettings, spec: Spec | None) -> int:
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
