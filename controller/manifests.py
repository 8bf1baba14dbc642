"""Kubernetes manifests for one attempt (a Secret and a Job), and how a finished Job is read.

API-shaped dicts, built without `kubernetes` (tested without a cluster). A Job per attempt,
`agl-<rollout>-<attempt>`, labelled with both; tokens live only in its Secret (same name, owned by
the Job). A grader is the main container after the harness as init container, sharing an emptyDir
at `spec.workspace`; each gets only its own token. Ends: Complete -> ran; DeadlineExceeded -> timed
out; harness exit != 0 -> task; image pull, eviction, node loss, start errors, grader -> infra.
A rendered Job (`reported`) ends on its own: harness and grader run under `TIMED`, which keeps their exit
codes in the workspace, and a last container runs `controller/report.py` with the rollout's own token.
"""

import math
from pathlib import Path
from typing import Any

from agl.types import JSON, FailureKind, Status
from controller import report
from controller.launcher import OK, Credentials, Key, Outcome
from controller.spec import Process, Spec

ROLLOUT_LABEL, ATTEMPT_LABEL = "agl.dev/rollout", "agl.dev/attempt"
INFRA_WAITING = {
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
}
INFRA_POD = {
    "Evicted",
    "NodeLost",
    "NodeShutdown",
    "Shutdown",
    "Terminated",
    "UnexpectedAdmissionError",
}
INFRA_START = {"StartError", "ContainerCannotRun", "CreateContainerError"}
AGENT_KEYS = {
    "OPENAI_API_KEY": "agent-token",
    "ANTHROPIC_API_KEY": "agent-token",
}  # env name -> key in the Secret
GRADER_KEYS = {"AGL_GRADER_TOKEN": "grader-token"}
# sh -c TIMED agl OUT AFTER SECONDS COMMAND...: if AFTER is "" or a file holding 0, run COMMAND for at most
# SECONDS; its exit code goes to OUT, and the container exits 0 so that the next one runs.
TIMED = 'out=$1 after=$2; shift 2; if [ -n "$after" ]; then read c < "$after" && [ "$c" = 0 ] || exit 0; fi; '
TIMED += 'timeout -k 10 "$@"; echo $? > "$out"'
REPORT_S = (
    120  # a rendered Job's deadline beyond its harness's and grader's: `timeout -k` and the report
)


def name_of(key: Key) -> str:
    return f"agl-{key[0][:48].lower()}-{key[1]}"


def key_of(obj: JSON) -> Key | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if ROLLOUT_LABEL not in labels or not str(labels.get(ATTEMPT_LABEL, "")).isdigit():
        return None
    return labels[ROLLOUT_LABEL], int(labels[ATTEMPT_LABEL])


def _container(
    name: str, proc: Process, env: dict[str, str], keys: dict[str, str], secret: str, ws: str
) -> JSON:
    """The tokens (`keys`) come from the Secret, the rest of `env` as values."""
    values = [{"name": k, "value": v} for k, v in (proc.env | env).items() if k not in keys]
    refs = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": v}}}
        for k, v in keys.items()
    ]
    out: JSON = {"name": name, "image": proc.image, "command": proc.command, "env": values + refs}
    out |= {"workingDir": proc.cwd or ws, "volumeMounts": [{"name": "workspace", "mountPath": ws}]}
    wanted = proc.resources.model_dump(exclude_none=True)
    return out | ({"resources": {"requests": wanted, "limits": wanted}} if wanted else {})


def deadline_s(spec: Spec, reported: bool = False) -> int:
    """The Job's `activeDeadlineSeconds`: the harness's timeout and the grader's (and the report's)."""
    return (
        math.ceil(spec.harness.timeout_s + (spec.grader.timeout_s if spec.grader else 0))
        + REPORT_S * reported
    )


def _timed(proc: Process, out: str, after: str = "") -> Process:
    return proc.model_copy(
        update={
            "command": ["sh", "-c", TIMED, "agl", out, after, str(proc.timeout_s), *proc.command]
        }
    )


def manifests(spec: Spec, creds: Credentials, *, reported: bool = False) -> tuple[JSON, JSON]:
    """The Secret and the Job of one attempt (the Secret's owner is set after the Job exists)."""
    name = name_of((creds.rollout_id, creds.attempt))
    labels = spec.labels | {ROLLOUT_LABEL: creds.rollout_id, ATTEMPT_LABEL: str(creds.attempt)}
    meta = {"name": name, "namespace": spec.namespace, "labels": labels}
    tokens = {"agent-token": creds.agent_token} | (
        {"grader-token": creds.grader_token} if creds.grader_token else {}
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": dict(meta),
        "type": "Opaque",
        "stringData": tokens,
    }
    ws, harness_proc, grader_proc = spec.workspace, spec.harness, spec.grader
    if reported:
        harness_proc = _timed(spec.harness, f"{ws}/.agl-harness")
        grader_proc = spec.grader and _timed(spec.grader, f"{ws}/.agl-grader", f"{ws}/.agl-harness")
    harness = _container("harness", harness_proc, creds.harness_env(), AGENT_KEYS, name, ws)
    pod: JSON = {
        "restartPolicy": "Never",
        "volumes": [{"name": "workspace", "emptyDir": {}}],
        "containers": [harness],
    }
    if grader_proc:  # the harness runs first, as the init container
        grader = _container("grader", grader_proc, creds.grader_env(), GRADER_KEYS, name, ws)
        pod |= {"initContainers": [harness], "containers": [grader]}
    if reported:  # the others run first; the token of whoever posts the reward reports the end
        source = Path(report.__file__).read_text()
        graded = "graded" if spec.grader else "ungraded"
        reporter = Process(command=["python3", "-c", source, ws, graded], image=spec.report_image)
        token = {"AGL_TOKEN": "grader-token" if spec.grader else "agent-token"}
        last = _container("report", reporter, creds.common_env(), token, name, ws)
        pod |= {
            "initContainers": pod.get("initContainers", []) + pod["containers"],
            "containers": [last],
        }
    pod |= {"serviceAccountName": spec.service_account} if spec.service_account else {}
    pod |= {"nodeSelector": spec.node_selector} if spec.node_selector else {}
    job_spec = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": deadline_s(spec, reported),
        "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    job: JSON = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
    return secret, job


def _conditions(job: JSON) -> dict[str, JSON]:
    found = (job.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if c.get("status") == "True"}


def finished(job: JSON) -> bool:
    return bool({"Complete", "Failed"} & set(_conditions(job)))


def job_outcome(job: JSON, pods: list[JSON]) -> Outcome | None:
    """How a Job ended, from its status and its pods; None while it runs and nothing is wrong."""
    conditions, found = _conditions(job), pod_outcome(pods)
    if "Complete" in conditions:
        return OK
    if (
        failed := conditions.get("Failed")
    ) is None:  # still running: only an infra failure ends it early
        return found if found is not None and found.failure_kind is FailureKind.INFRA else None
    if failed.get("reason") == "DeadlineExceeded":
        return Outcome(Status.TIMED_OUT, FailureKind.TASK, "the Job ran past activeDeadlineSeconds")
    return found or Outcome.infra(
        f"Job failed: {failed.get('reason', '')} {failed.get('message', '')}".strip()
    )


def pod_outcome(pods: list[JSON]) -> Outcome | None:
    """A failure visible on the pods (the newest first), or None."""
    for pod in sorted(
        pods, key=lambda p: str(p["metadata"].get("creationTimestamp", "")), reverse=True
    ):
        status: JSON = pod.get("status") or {}
        if status.get("reason") in INFRA_POD:
            return Outcome.infra(f"pod {status['reason']}: {status.get('message', '')}".strip())
        containers: list[Any] = (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        )
        for c in containers:
            state = c.get("state") or {}
            waiting, ended = state.get("waiting") or {}, state.get("terminated") or {}
            if waiting.get("reason") in INFRA_WAITING:
                return Outcome.infra(
                    f"{c['name']}: {waiting['reason']}: {waiting.get('message', '')}".strip()
                )
            if ended and ended.get("reason") in INFRA_START:
                return Outcome.infra(
                    f"{c['name']} did not start: {ended.get('message') or ended['reason']}"
                )
            if ended and ended.get("exitCode", 0) != 0:
                return Outcome.exited(c["name"], ended["exitCode"])
    return None
