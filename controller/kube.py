"""The Kubernetes launcher: one Job (and its Secret) per attempt, watched by label.

- The only module that imports `kubernetes` (its blocking client runs in threads).
- It creates the Secret, then the Job, which then owns the Secret, and watches every Job labelled
  `agl.dev/rollout` in its namespace (`agl jobs render`'s too).
- Ends it finds, built by `outcome.py`: a Job deleted before it finished -> lost; one whose pods
  fail without ending it (an image pull; pods checked every `pod_check_s`) -> as
  `manifests.job_outcome` reads it, and the Job is deleted.
- A create refused with 400/422 is the spec's fault (a permanent `LaunchError`: a task failure);
  any other create error is retried.
- No statuses, no manifests here.
"""

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from agl.types import JSON
from controller.launcher import AttemptKey, Credentials, LaunchError
from controller.manifests import ROLLOUT_LABEL, finished, job_outcome, key_of, manifests, name_of
from controller.outcome import Outcome
from controller.spec import Spec

log = logging.getLogger(__name__)
API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)  # a refusal, or no answer at all


class KubeLauncher:
    """Runs attempts as Jobs in `namespace`; call `close()` to stop the watch thread."""

    def __init__(
        self,
        namespace: str = "default",
        *,
        pod_check_s: float = 10.0,
        secret_grace_s: float = 300.0,
    ) -> None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.api = client.ApiClient()
        self.batch = client.BatchV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.namespace = namespace
        self.pod_check_s = pod_check_s
        self.secret_grace_s = secret_grace_s
        self.lock = threading.Lock()
        self.jobs: dict[AttemptKey, JSON] = {}  # the watch's view of every labelled Job
        self.deleted: set[AttemptKey] = set()  # Jobs that went away while watched
        self.ended: dict[AttemptKey, Outcome] = {}
        # Recorded by the loop; ignored until their Job is gone.
        self.released: set[AttemptKey] = set()
        self.pods_checked = 0.0
        self.stopping = threading.Event()
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="agl-kube-watch", daemon=True)

    def _dict(self, obj: Any) -> JSON:
        """A client object as the API's JSON (camelCase keys), as `manifests.py` reads it."""
        return dict(self.api.sanitize_for_serialization(obj))

    # ---------------------------------------------------------------- the watch thread

    def _relist(self) -> str:
        """Read every labelled Job afresh (those gone meanwhile: deleted); the list's version."""
        found = self.batch.list_namespaced_job(self.namespace, label_selector=ROLLOUT_LABEL)
        jobs = {k: job for job in map(self._dict, found.items) if (k := key_of(job)) is not None}
        with self.lock:
            self.deleted |= set(self.jobs) - set(jobs)
            self.jobs = jobs
        self.synced.set()
        return str(found.metadata.resource_version)

    def _watch(self) -> None:
        """The watch thread: follow the labelled Jobs until `close`, re-listing after an error."""
        version = ""
        while not self.stopping.is_set():
            try:
                version = self._follow(version or self._relist())
            except API_ERRORS as e:
                gone = isinstance(e, ApiException) and e.status == 410
                # 410 Gone: our version is too old; anything else is worth a word and a pause.
                if not gone:
                    log.warning("watching Jobs: %r", e)
                    self.stopping.wait(1)
                version = ""  # re-list

    def _follow(self, version: str) -> str:
        """Apply the Job events after `version` (one watch request, 30 s at most); the last
        version seen."""
        since = {
            "label_selector": ROLLOUT_LABEL,
            "resource_version": version,
            "timeout_seconds": 30,
        }
        events = watch.Watch().stream(self.batch.list_namespaced_job, self.namespace, **since)
        for event in events:
            job = self._dict(event["object"])
            version = job["metadata"].get("resourceVersion") or version
            key = key_of(job)
            if key is None:
                continue
            with self.lock:
                if event["type"] == "DELETED":
                    self.jobs.pop(key, None)
                    self.deleted.add(key)
                else:
                    self.jobs[key] = job
            if self.stopping.is_set():
                break
        return version

    def close(self) -> None:
        """Stop the watch thread (at its next event, or within 30 s)."""
        self.stopping.set()

    # ---------------------------------------------------------------- the Launcher protocol

    async def launch(self, spec: Spec, creds: Credentials) -> str:
        return await asyncio.to_thread(self._create, spec, creds)

    def _create(self, spec: Spec, creds: Credentials) -> str:
        """Create the attempt's Secret and Job (the Job then owns the Secret); where it runs."""
        secret, job = manifests(spec, creds)
        name = job["metadata"]["name"]
        ns = spec.namespace
        try:
            self._apply_secret(ns, name, secret)
            created = self._apply_job(ns, name, job)
            self._own(created)
        except API_ERRORS as e:
            # A launch that failed leaves no tokens behind.
            with contextlib.suppress(*API_ERRORS):
                self.core.delete_namespaced_secret(name, ns)
            raise _launch_error(e) from e
        with self.lock:
            self.jobs.setdefault(creds.key, created)
        return f"job {ns}/{name}"

    def _apply_secret(self, ns: str, name: str, secret: JSON) -> None:
        """Create the Secret, or replace it: a retried launch brings new tokens."""
        try:
            self.core.create_namespaced_secret(ns, secret)
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.replace_namespaced_secret(name, ns, secret)

    def _apply_job(self, ns: str, name: str, job: JSON) -> JSON:
        """Create the Job, or read the one a launch cut short created; as the API has it."""
        try:
            return self._dict(self.batch.create_namespaced_job(ns, job))
        except ApiException as e:
            if e.status != 409:
                raise
            return self._dict(self.batch.read_namespaced_job(name, ns))

    def _own(self, job: JSON) -> None:
        """Make the Job its Secret's owner: the Secret goes with the Job."""
        meta = job["metadata"]
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        self.core.patch_namespaced_secret(
            meta["name"], meta["namespace"], {"metadata": {"ownerReferences": [ref]}}
        )

    async def adopt(self) -> list[AttemptKey]:
        self.thread.start()
        await asyncio.to_thread(self.synced.wait, 60)
        with self.lock:
            return list(self.jobs)

    async def poll(self) -> list[tuple[AttemptKey, Outcome]]:
        with self.lock:
            jobs = dict(self.jobs)
            gone = set(self.deleted)
            self.deleted.clear()
        for key in gone:
            if key not in self.released and key not in self.ended:
                self.ended[key] = Outcome.lost("the Job was deleted before it finished")
            self.released.discard(key)
        pods = await self._pods(jobs)
        for key, job in jobs.items():
            if key in self.ended or key in self.released:
                continue
            outcome = job_outcome(job, pods.get(key, []))
            if outcome is None:
                continue
            self.ended[key] = outcome
            if outcome.failure_kind and not finished(job):
                await self.stop(key)  # e.g. stuck pulling its image: nothing will end it
        return list(self.ended.items())

    async def _pods(self, jobs: dict[AttemptKey, JSON]) -> dict[AttemptKey, list[JSON]]:
        """The pods of Jobs that ended, and (every pod_check_s) of those still running; the Secrets
        are seen to."""
        ended = any(finished(job) for key, job in jobs.items() if key not in self.released)
        if not ended and time.monotonic() - self.pods_checked < self.pod_check_s:
            return {}
        self.pods_checked = time.monotonic()
        labelled = {"label_selector": ROLLOUT_LABEL}
        try:
            found = await asyncio.to_thread(
                self.core.list_namespaced_pod, self.namespace, **labelled
            )
            secrets = await asyncio.to_thread(
                self.core.list_namespaced_secret, self.namespace, **labelled
            )
        except API_ERRORS as e:
            log.warning("listing pods and Secrets: %r", e)
            return {}
        pods: dict[AttemptKey, list[JSON]] = {}
        for pod in map(self._dict, found.items):
            key = key_of(pod)
            if key is not None:
                pods.setdefault(key, []).append(pod)
        await self._collect_secrets(jobs, secrets.items)
        return pods

    async def collect(self) -> list[str]:
        """`agl jobs gc`: what `poll` does to Secrets, once, for a namespace with no controller;
        the names deleted."""
        await asyncio.to_thread(self._relist)
        found = await asyncio.to_thread(
            self.core.list_namespaced_secret, self.namespace, label_selector=ROLLOUT_LABEL
        )
        return await self._collect_secrets(self.jobs, found.items)

    async def _collect_secrets(self, jobs: dict[AttemptKey, JSON], secrets: list[Any]) -> list[str]:
        """Secrets applied by hand next to their Job get the Job as owner, as ours do, so that they
        go with it. One with no owner and no Job (gone unseen, or never applied) goes once
        `secret_grace_s` old: it holds live tokens. The names deleted."""
        deleted = []
        for secret in secrets:
            meta = secret.metadata
            key = key_of(self._dict(secret))
            if meta.owner_references or key is None or key in self.released:
                continue
            age_s = time.time() - meta.creation_timestamp.timestamp()
            with contextlib.suppress(*API_ERRORS):
                if key in jobs and "uid" in jobs[key]["metadata"]:
                    await asyncio.to_thread(self._own, jobs[key])
                elif key not in jobs and age_s > self.secret_grace_s:
                    log.info("deleting Secret %s/%s: its Job is gone", self.namespace, meta.name)
                    await asyncio.to_thread(
                        self.core.delete_namespaced_secret, meta.name, self.namespace
                    )
                    deleted.append(meta.name)
        return deleted

    async def release(self, key: AttemptKey) -> None:
        self.ended.pop(key, None)
        with self.lock:
            if key in self.jobs:
                self.released.add(key)

    async def stop(self, key: AttemptKey) -> None:
        options = client.V1DeleteOptions(propagation_policy="Background")
        # Reported as failed either way; a failed delete must not stop the loop.
        with contextlib.suppress(*API_ERRORS):
            await asyncio.to_thread(
                self.batch.delete_namespaced_job, name_of(key), self.namespace, body=options
            )

    def active(self) -> int:
        with self.lock:
            return len(set(self.jobs) - self.released)


def _launch_error(e: Exception) -> LaunchError:
    """A refused or unanswered create as a `LaunchError`: a 400 or 422 is the spec's fault
    (permanent, a task failure), anything else an infra failure, retried."""
    if not isinstance(e, ApiException):
        return LaunchError(f"Kubernetes API unreachable: {e!r}")
    permanent = e.status in (400, 422)
    return LaunchError(f"Kubernetes API {e.status}: {str(e.body)[:500]}", permanent=permanent)
