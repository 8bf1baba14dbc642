"""Kubernetes manifests for one attempt (a Secret and a Job), and how a finished Job is read.

- API-shaped dicts, built without `kubernetes` (tested without a cluster).
- A Job per attempt, `agl-<rollout>-<attempt>`, labelled with both; tokens live only in its Secret
  (same name, owned by the Job).
- A grader is the main container after the harness as init container, sharing an emptyDir at
  `spec.workspace`; each gets only its own token.
- Ends, each through its constructor in `outcome.py`: Complete -> ran; DeadlineExceeded -> timed
  out; a harness's or grader's exit code -> `outcome.exited`; an image pull or start error ->
  launch failed; eviction, node loss, a Failed Job with no exit code -> lost.
- A rendered Job (`reported`) ends on its own: harness and grader run under `TIMED`, which keeps
  their exit codes in the workspace, and a last container runs `reporter_program` (the outcome
  rule and `report.py`) with the rollout's own token.
"""

import math
from pathlib import Path
from typing import Any

from agl.types import JSON
from controller import outcome, report
from controller.launcher import AttemptKey, Credentials
from controller.outcome import INFRA, RAN, Outcome, exited
from controller.spec import Process, Spec

ROLLOUT_LABEL = "agl.dev/rollout"
ATTEMPT_LABEL = "agl.dev/attempt"
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
# env name -> key in the Secret
AGENT_KEYS = {"OPENAI_API_KEY": "agent-token", "ANTHROPIC_API_KEY": "agent-token"}
GRADER_KEYS = {"AGL_GRADER_TOKEN": "grader-token"}
# sh -c TIMED agl OUT AFTER SECONDS COMMAND...: if AFTER is "" or a file holding 0, run COMMAND for
# at most SECONDS; its exit code goes to OUT, and the container exits 0 so that the next one runs.
TIMED = (
    'out=$1 after=$2; shift 2; if [ -n "$after" ]; then read c < "$after" && [ "$c" = 0 ] || exit 0;'
    ' fi; timeout -k 10 "$@"; echo $? > "$out"'
)
# A rendered Job's deadline beyond its harness's and grader's: `timeout -k` and the report.
REPORT_S = 120


def name_of(key: AttemptKey) -> str:
    return f"agl-{key.rollout_id[:48].lower()}-{key.attempt}"


def key_of(obj: JSON) -> AttemptKey | None:
    """The attempt an object's labels name (a Job, its pods, its Secret), or None."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if ROLLOUT_LABEL not in labels or not str(labels.get(ATTEMPT_LABEL, "")).isdigit():
        return None
    return AttemptKey(rollout_id=labels[ROLLOUT_LABEL], attempt=int(labels[ATTEMPT_LABEL]))


def reporter_program() -> str:
    """What a rendered Job's last container runs with `python3 -c`: the outcome rule's source, then
    the reporter's, which uses it (the pod has neither agl nor the controller)."""
    return Path(outcome.__file__).read_text() + "\n" + Path(report.__file__).read_text()


def _container(
    name: str, proc: Process, env: dict[str, str], keys: dict[str, str], secret: str, ws: str
) -> JSON:
    """The tokens (`keys`) come from the Secret, the rest of `env` as values."""
    values = [{"name": k, "value": v} for k, v in (proc.env | env).items() if k not in keys]
    refs = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": v}}}
        for k, v in keys.items()
    ]
    container: JSON = {
        "name": name,
        "image": proc.image,
        "command": proc.command,
        "env": values + refs,
        "workingDir": proc.cwd or ws,
        "volumeMounts": [{"name": "workspace", "mountPath": ws}],
    }
    wanted = proc.resources.model_dump(exclude_none=True)
    if wanted:
        container["resources"] = {"requests": wanted, "limits": wanted}
    return container


def deadline_s(spec: Spec, reported: bool = False) -> int:
    """The Job's `activeDeadlineSeconds`: the harness's timeout and the grader's (and the
    report's)."""
    seconds = spec.harness.timeout_s
    if spec.grader:
        seconds += spec.grader.timeout_s
    return math.ceil(seconds) + REPORT_S * reported


def _timed(proc: Process, out: str, after: str = "") -> Process:
    """`proc` under `TIMED`: its exit code kept in `out`, run only if `after` holds 0."""
    command = ["sh", "-c", TIMED, "agl", out, after, str(proc.timeout_s), *proc.command]
    return proc.model_copy(update={"command": command})


def _secret(meta: JSON, creds: Credentials) -> JSON:
    """The attempt's tokens, the only place they live."""
    tokens = {"agent-token": creds.agent_token}
    if creds.grader_token:
        tokens["grader-token"] = creds.grader_token
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": dict(meta),
        "type": "Opaque",
        "stringData": tokens,
    }


def _pod(spec: Spec, creds: Credentials, name: str, reported: bool) -> JSON:
    """The Job's pod: the harness, then the grader if any, then (`reported`) the reporter; the
    last is the main container, those before it init containers."""
    ws = spec.workspace
    harness_proc = spec.harness
    grader_proc = spec.grader
    if reported:
        harness_proc = _timed(spec.harness, f"{ws}/.agl-harness")
        if spec.grader:
            grader_proc = _timed(spec.grader, f"{ws}/.agl-grader", f"{ws}/.agl-harness")
    containers = [_container("harness", harness_proc, creds.harness_env(), AGENT_KEYS, name, ws)]
    if grader_proc:
        grader_env = creds.grader_env()
        containers.append(_container("grader", grader_proc, grader_env, GRADER_KEYS, name, ws))
    if reported:
        containers.append(_reporter(spec, creds, name))
    pod: JSON = {
        "restartPolicy": "Never",
        "volumes": [{"name": "workspace", "emptyDir": {}}],
    }
    if len(containers) > 1:
        pod["initContainers"] = containers[:-1]
    pod["containers"] = containers[-1:]
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if spec.node_selector:
        pod["nodeSelector"] = spec.node_selector
    return pod


def _reporter(spec: Spec, creds: Credentials, name: str) -> JSON:
    """A rendered Job's last container: `reporter_program`, with the token of whoever posts the
    reward (the grader's, if there is one)."""
    graded = "ungraded"
    token = {"AGL_TOKEN": "agent-token"}
    if spec.grader:
        graded = "graded"
        token = {"AGL_TOKEN": "grader-token"}
    program = ["python3", "-c", reporter_program(), spec.workspace, graded]
    reporter = Process(command=program, image=spec.report_image)
    return _container("report", reporter, creds.common_env(), token, name, spec.workspace)


def manifests(spec: Spec, creds: Credentials, *, reported: bool = False) -> tuple[JSON, JSON]:
    """The Secret and the Job of one attempt (the Secret's owner is set after the Job exists)."""
    name = name_of(creds.key)
    labels = spec.labels | {ROLLOUT_LABEL: creds.rollout_id, ATTEMPT_LABEL: str(creds.attempt)}
    meta = {"name": name, "namespace": spec.namespace, "labels": labels}
    job_spec = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": deadline_s(spec, reported),
        "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
        "template": {"metadata": {"labels": labels}, "spec": _pod(spec, creds, name, reported)},
    }
    job: JSON = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
    return _secret(meta, creds), job


def _conditions(job: JSON) -> dict[str, JSON]:
    found = (job.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if c.get("status") == "True"}


def finished(job: JSON) -> bool:
    return bool({"Complete", "Failed"} & set(_conditions(job)))


def job_outcome(job: JSON, pods: list[JSON]) -> Outcome | None:
    """How a Job ended, from its status and its pods; None while it runs and nothing is wrong."""
    conditions = _conditions(job)
    found = pod_outcome(pods)
    if "Complete" in conditions:
        return RAN
    failed = conditions.get("Failed")
    if failed is None:
        # Still running: only an infra failure ends it early.
        if found is not None and found.failure_kind == INFRA:
            return found
        return None
    if failed.get("reason") == "DeadlineExceeded":
        return Outcome.timed_out("the Job ran past activeDeadlineSeconds")
    if found is not None:
        return found
    why = f"{failed.get('reason', '')} {failed.get('message', '')}".strip()
    return Outcome.lost(f"Job failed: {why}")


def pod_outcome(pods: list[JSON]) -> Outcome | None:
    """A failure visible on the pods (the newest first), or None."""
    newest_first = sorted(
        pods, key=lambda p: str(p["metadata"].get("creationTimestamp", "")), reverse=True
    )
    for pod in newest_first:
        status: JSON = pod.get("status") or {}
        if status.get("reason") in INFRA_POD:
            return Outcome.lost(f"pod {status['reason']}: {status.get('message', '')}".strip())
        containers: list[Any] = status.get("initContainerStatuses") or []
        containers += status.get("containerStatuses") or []
        for container in containers:
            found = _container_outcome(container)
            if found is not None:
                return found
    return None


def _container_outcome(container: JSON) -> Outcome | None:
    """A failure visible on one container's status, or None."""
    name = container["name"]
    state = container.get("state") or {}
    waiting = state.get("waiting") or {}
    ended = state.get("terminated") or {}
    if waiting.get("reason") in INFRA_WAITING:
        why = f"{name}: {waiting['reason']}: {waiting.get('message', '')}".strip()
        return Outcome.launch_failed(why)
    if ended.get("reason") in INFRA_START:
        why = f"{name} did not start: {ended.get('message') or ended['reason']}"
        return Outcome.launch_failed(why)
    code = ended.get("exitCode", 0)
    if code == 0:
        return None
    if name == "harness":
        return exited(code)
    if name == "grader":
        return exited(0, code, graded=True)
    # The reporter: the end it should have posted is not known here.
    return Outcome.lost(f"{name} exited with {code}")
