"""The Kubernetes launcher against the cluster KUBECONFIG names (CI: kube-local, whose pods are
local processes).

End to end: a real gateway, the controller with the Kubernetes launcher, Jobs whose containers run
Python harness and grader scripts that call the gateway with the injected credentials.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller import jobs
from tests.controller.conftest import GRADER, controller, harness_spec, reasons, script, wait_status
from tests.gateway.stack import ADMIN

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG names no cluster"),
]


@pytest.fixture
def namespace() -> Iterator[str]:
    from kubernetes import client, config

    config.load_kube_config()
    core = client.CoreV1Api()
    name = f"agl-test-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    deadline = time.monotonic() + 30
    while not core.list_namespaced_service_account(name).items:  # pods are refused until it exists
        assert time.monotonic() < deadline
        time.sleep(0.2)
    yield name
    core.delete_namespace(name)


def kube_launcher(namespace: str):
    from controller.kube import KubeLauncher

    return KubeLauncher(namespace, pod_check_s=1.0)


def graded_spec(tmp_path: Path, namespace: str, **harness_env: str) -> dict:
    spec = harness_spec(tmp_path, env=harness_env)
    spec["grader"] = {
        "command": script(tmp_path, "grader.py", GRADER),
        "env": {"GRADER_OUT": str(tmp_path / "g")},
    }
    return spec | {
        "namespace": namespace,
        "workspace": str(tmp_path / "ws"),
        "retry_backoff_s": 0.1,
    }


def test_job_end_to_end_with_grader(gateway, tmp_path: Path, namespace: str) -> None:
    from kubernetes import client

    rid = gateway.rollout(grader=True)["id"]
    launcher = kube_launcher(namespace)
    with controller(
        gateway, tmp_path, graded_spec(tmp_path, namespace), launcher, launcher="kubernetes"
    ):
        done = wait_status(gateway, rid, timeout=90)
        secret = client.CoreV1Api().read_namespaced_secret(f"agl-{rid}-1", namespace)
    launcher.close()
    assert done["status"] == "succeeded" and done["reward"] == 0.5, reasons(gateway, rid)
    assert len(gateway.admin.get(f"/api/rollouts/{rid}/calls").json()) == 1
    assert secret.metadata.owner_references[0].kind == "Job"  # collected with its Job
    harness_env = json.loads((tmp_path / "harness.1.env").read_text())
    grader_env = json.loads((tmp_path / "g").read_text())
    assert "AGL_GRADER_TOKEN" not in harness_env and "OPENAI_API_KEY" not in grader_env
    assert (
        harness_env["OPENAI_BASE_URL"] == gateway.url + "/v1"
        and harness_env["AGL_ROLLOUT_ID"] == rid
    )


def test_deleted_job_is_an_infra_failure_and_retried(
    gateway, tmp_path: Path, namespace: str
) -> None:
    from kubernetes import client

    rid = gateway.rollout(grader=True)["id"]
    launcher = kube_launcher(namespace)
    spec = graded_spec(tmp_path, namespace, HARNESS_SLEEP_1="300")
    with controller(gateway, tmp_path, spec, launcher, launcher="kubernetes"):
        deadline = time.monotonic() + 60
        while not (tmp_path / "harness.1.called").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        options = client.V1DeleteOptions(propagation_policy="Background")
        client.BatchV1Api().delete_namespaced_job(f"agl-{rid}-1", namespace, body=options)
        done = wait_status(gateway, rid, timeout=90)
    launcher.close()
    assert (done["status"], done["attempt"], done["reward"]) == ("succeeded", 2, 0.5), reasons(
        gateway, rid
    )
    assert any("deleted" in r and "infra" in r for r in reasons(gateway, rid))
    assert [c["attempt"] for c in gateway.admin.get(f"/api/rollouts/{rid}/calls").json()] == [2]


def test_cancelling_a_running_rollout_deletes_its_job(
    gateway, tmp_path: Path, namespace: str
) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    rid = gateway.rollout()["id"]
    launcher = kube_launcher(namespace)
    spec = harness_spec(tmp_path, env={"HARNESS_SLEEP_1": "300"}) | {"namespace": namespace}
    with controller(gateway, tmp_path, spec, launcher, launcher="kubernetes"):
        deadline = time.monotonic() + 60
        while not (tmp_path / "harness.1.called").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        gateway.admin.post(
            f"/api/rollouts/{rid}/status", json={"status": "cancelled"}
        ).raise_for_status()
        deadline = time.monotonic() + 10
        while True:
            try:
                client.BatchV1Api().read_namespaced_job(f"agl-{rid}-1", namespace)
            except ApiException as e:
                assert e.status == 404
                break
            assert time.monotonic() < deadline, "the cancelled rollout's Job is still there"
            time.sleep(0.2)
    launcher.close()
    assert wait_status(gateway, rid)["status"] == "cancelled"


def test_api_422_is_a_task_failure(gateway, tmp_path: Path, namespace: str) -> None:
    rid = gateway.rollout()["id"]
    launcher = kube_launcher(namespace)
    spec = {
        "harness": {"command": ["true"]},
        "namespace": namespace,
        "labels": {"team": "not a valid value!"},
    }
    with controller(gateway, tmp_path, spec, launcher, launcher="kubernetes"):
        done = wait_status(gateway, rid, timeout=60)
    launcher.close()
    assert (done["status"], done["failure_kind"], done["attempt"]) == ("failed", "task", 1)
    assert any("422" in r for r in reasons(gateway, rid))
    from kubernetes import client

    assert (
        not client.CoreV1Api()
        .list_namespaced_secret(namespace, label_selector="agl.dev/rollout")
        .items
    )


def test_rendered_manifests_validate_apply_and_are_adopted(
    gateway, tmp_path: Path, namespace: str, capsys
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(graded_spec(tmp_path, namespace)))
    argv = [
        "render",
        "--spec",
        str(spec_file),
        "--count",
        "1",
        "--group",
        "manual",
        "--task",
        '{"n": 7}',
    ]
    assert jobs.main([*argv, "--gateway", gateway.url, "--admin-key", ADMIN]) == 0
    rendered = capsys.readouterr().out
    (tmp_path / "rendered.yaml").write_text(rendered)
    validate = Path(__file__).parents[2] / ".venv/bin/kubernetes-validate"
    if validate.exists():
        checked = subprocess.run(
            [str(validate), "--strict", str(tmp_path / "rendered.yaml")], capture_output=True
        )
        assert checked.returncode == 0, checked.stdout
    (rollout,) = gateway.admin.get("/api/rollouts", params={"group": "manual"}).json()
    launcher = kube_launcher(namespace)
    with controller(gateway, tmp_path, None, launcher, launcher="kubernetes"):
        time.sleep(1.0)  # a running controller does not launch a manifest rollout itself
        assert gateway.admin.get(f"/api/rollouts/{rollout['id']}").json()["status"] == "queued"
        applied = subprocess.run(
            [kubectl, "apply", "-f", "-"], input=rendered, capture_output=True, text=True
        )
        assert applied.returncode == 0, applied.stderr
        done = wait_status(gateway, rollout["id"], timeout=90)
    launcher.close()
    assert done["status"] == "succeeded" and done["reward"] == 0.5, reasons(gateway, rollout["id"])
    assert json.loads(json.loads((tmp_path / "harness.1.env").read_text())["AGL_TASK"]) == {"n": 7}


def test_an_applied_job_that_vanished_while_no_controller_ran_is_an_infra_failure(
    gateway, tmp_path: Path, namespace: str, capsys
) -> None:
    """Its rollout was running (its harness had called the model); the Job went (the TTL
    controller, a person) while no controller ran. The next controller makes it an infra failure,
    and retries it, and deletes the Secret the Job left (no controller made the Job its owner),
    which holds live tokens (#24)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(graded_spec(tmp_path, namespace, HARNESS_SLEEP_1="300")))
    argv = ["render", "--spec", str(spec_file), "--gateway", gateway.url, "--admin-key", ADMIN]
    assert jobs.main(argv) == 0
    applied = subprocess.run(
        [kubectl, "apply", "-f", "-"], input=capsys.readouterr().out, capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stderr
    (rollout,) = gateway.admin.get("/api/rollouts", params={"group": "manual"}).json()
    wait_status(gateway, rollout["id"], {"running"}, timeout=60)
    batch = client.BatchV1Api()
    name = f"agl-{rollout['id']}-1"
    batch.delete_namespaced_job(
        name, namespace, body=client.V1DeleteOptions(propagation_policy="Background")
    )
    deadline = time.monotonic() + 30
    with pytest.raises(ApiException):  # 404 once it is gone
        while time.monotonic() < deadline:
            batch.read_namespaced_job(name, namespace)
            time.sleep(0.2)
    core = client.CoreV1Api()
    assert not core.read_namespaced_secret(name, namespace).metadata.owner_references  # left behind
    from controller.kube import KubeLauncher

    launcher = KubeLauncher(namespace, pod_check_s=0.5, secret_grace_s=2.0)
    with controller(gateway, tmp_path, None, launcher, launcher="kubernetes", namespace=namespace):
        done = wait_status(gateway, rollout["id"], timeout=90)
        deadline = time.monotonic() + 30
        while [s for s in core.list_namespaced_secret(namespace).items if s.metadata.name == name]:
            assert time.monotonic() < deadline, "the Secret of a Job that is gone is still there"
            time.sleep(0.2)
        assert core.read_namespaced_secret(
            f"agl-{rollout['id']}-2", namespace
        ).metadata.owner_references
    launcher.close()
    assert (done["status"], done["attempt"], done["reward"]) == ("succeeded", 2, 0.5), reasons(
        gateway, rollout["id"]
    )
    assert any("not found" in r and "infra" in r for r in reasons(gateway, rollout["id"]))


def test_pod_outcomes_map_to_failure_kinds(gateway, tmp_path: Path, namespace: str) -> None:
    base = {
        "namespace": namespace,
        "max_attempts": 2,
        "retry_backoff_s": 0.1,
        "workspace": str(tmp_path / "ws"),
    }
    exit3 = base | {"harness": {"command": ["sh", "-c", "exit 3"]}}
    grader_fails = base | {"harness": {"command": ["true"]}, "grader": {"command": ["false"]}}
    missing = base | {"harness": {"command": ["/no/such/harness"]}}
    ids = [
        gateway.rollout(metadata={"spec": exit3})["id"],
        gateway.rollout(grader=True, metadata={"spec": grader_fails})["id"],
        gateway.rollout(metadata={"spec": missing})["id"],
    ]
    launcher = kube_launcher(namespace)
    with controller(gateway, tmp_path, None, launcher, launcher="kubernetes"):
        done = [wait_status(gateway, rid, timeout=90) for rid in ids]
    launcher.close()
    got = [(d["status"], d["failure_kind"], d["attempt"]) for d in done]
    assert got == [("failed", "task", 1), ("failed", "infra", 2), ("failed", "infra", 2)], [
        reasons(gateway, i) for i in ids
    ]
    assert any("harness exited with 3" in r for r in reasons(gateway, ids[0]))
    assert any("grader exited with 1" in r for r in reasons(gateway, ids[1]))


def test_watch_relists_after_410_gone(namespace: str, monkeypatch) -> None:
    """A 410 (our resourceVersion was compacted away) cannot be caused on demand, so the first
    watch answers it; everything else is the real API server."""
    import asyncio

    from kubernetes.client.rest import ApiException

    from controller import kube
    from controller.launcher import Credentials
    from controller.spec import parse_spec

    real = kube.watch.Watch.stream
    calls = {"streams": 0, "lists": 0}

    def stream(self, *args, **kwargs):
        calls["streams"] += 1
        if calls["streams"] == 1:
            raise ApiException(status=410, reason="Gone")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kube.watch.Watch, "stream", stream)
    launcher = kube_launcher(namespace)
    relist = launcher._relist

    def counted() -> str:
        calls["lists"] += 1
        return relist()

    monkeypatch.setattr(launcher, "_relist", counted)
    spec = parse_spec({"harness": {"command": ["true"]}, "namespace": namespace})
    creds = Credentials(
        rollout_id="f" * 32,
        attempt=1,
        task={},
        gateway_url="http://127.0.0.1:9",
        base_url="http://127.0.0.1:9/v1",
        agent_token="t",
    )

    async def run() -> list:
        await launcher.adopt()
        await launcher.launch(spec, creds)
        for _ in range(300):
            if ended := await launcher.poll():
                return ended
            await asyncio.sleep(0.1)
        return []

    ended = asyncio.run(run())
    launcher.close()
    assert calls["lists"] >= 2 and calls["streams"] >= 2
    assert [(key, outcome.status) for key, outcome in ended] == [(("f" * 32, 1), "succeeded")]


def test_controller_waits_for_a_gateway_that_is_down_at_start(namespace: str) -> None:
    """The loop retries its adoption while the gateway is unreachable. That retry used to call the
    Kubernetes launcher's adopt() again, which started its watch thread a second time: the
    controller exited with `RuntimeError: threads can only be started once` instead of waiting
    (#24)."""
    import asyncio

    from agl.client import GatewayClient
    from controller.loop import Controller, ControllerSettings

    cfg = ControllerSettings(
        gateway="http://127.0.0.1:9", admin_key="k", launcher="kubernetes", poll_s=0.05
    )
    launcher = kube_launcher(namespace)

    async def run() -> None:
        stop = asyncio.Event()
        async with GatewayClient(cfg.gateway, cfg.admin_key) as gw:
            loop = asyncio.create_task(Controller(gw, launcher, None, cfg).run(stop))
            await asyncio.sleep(1.5)  # several ticks, each failing to reach the gateway
            assert not loop.done()
            stop.set()
            await loop

    try:
        asyncio.run(run())
    finally:
        launcher.close()


def test_a_controller_started_before_its_gateway_then_beside_a_wrong_key_recovers(
    tiny_path: Path, tmp_path: Path, namespace: str
) -> None:
    """As a cluster comes up: the controller starts first (nothing listens), then the gateway runs
    with another admin key (every call refused), then the gateway is restarted with the
    controller's key. The controller waits through both and launches the rollout as a Job once it
    can."""
    import asyncio
    import socket
    import threading

    from agl.client import GatewayClient
    from controller.loop import Controller, ControllerSettings
    from controller.spec import parse_spec
    from tests.gateway.stack import stack

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = ControllerSettings(
        gateway=f"http://127.0.0.1:{port}", admin_key=ADMIN, launcher="kubernetes", poll_s=0.1
    )
    spec = parse_spec(
        harness_spec(tmp_path) | {"namespace": namespace, "workspace": str(tmp_path / "ws")}
    )
    launcher = kube_launcher(namespace)
    box: dict = {}
    for name in ("wrong", "right"):
        (tmp_path / name).mkdir()

    async def run() -> None:
        box["loop"] = asyncio.get_running_loop()
        box["stop"] = asyncio.Event()
        async with GatewayClient(cfg.gateway, cfg.admin_key) as gw:
            await Controller(gw, launcher, spec, cfg).run(box["stop"])

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    try:
        time.sleep(1.5)  # several ticks with nothing listening
        with stack(tiny_path, tmp_path / "wrong", port=port, admin="another-key") as wrong:
            queued = wrong.rollout()["id"]
            time.sleep(1.5)  # several ticks refused
            assert wrong.admin.get(f"/api/rollouts/{queued}").json()["status"] == "queued"
        assert thread.is_alive()
        with stack(tiny_path, tmp_path / "right", port=port) as right:
            rid = right.rollout()["id"]
            done = wait_status(right, rid, timeout=90)
            assert done["status"] == "succeeded", reasons(right, rid)
            assert any("launched by kubernetes" in r for r in reasons(right, rid))
    finally:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)
        launcher.close()
    assert not thread.is_alive()


def test_applied_jobs_end_on_their_own_and_gc_takes_their_secrets(
    gateway, tmp_path: Path, namespace: str, capsys
) -> None:
    """`kubectl apply` with no controller anywhere: each Job reports its own end with the rollout's
    token, and once the TTL controller has taken the Jobs, `agl jobs gc` deletes the Secrets they
    left (#24)."""
    from kubernetes import client

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    quick = {"ttl_after_finished_s": 1}
    specs = {
        ("succeeded", None, 0.5): graded_spec(tmp_path, namespace) | quick,
        ("succeeded", None, 1.0): harness_spec(tmp_path) | {"namespace": namespace} | quick,
        ("failed", "task", 1.0): harness_spec(tmp_path, env={"HARNESS_EXIT": "3"})
        | {"namespace": namespace}
        | quick,
        ("timed_out", "task", None): harness_spec(
            tmp_path, env={"HARNESS_SLEEP_1": "60"}, timeout_s=3
        )
        | {"namespace": namespace}
        | quick,
        ("failed", "infra", None): graded_spec(tmp_path, namespace)
        | quick
        | {"grader": {"command": ["false"]}},
    }
    rendered = []
    ids = {}
    for i, (want, spec) in enumerate(specs.items()):
        (tmp_path / f"spec{i}.json").write_text(json.dumps(spec))
        argv = ["render", "--spec", str(tmp_path / f"spec{i}.json"), "--group", f"g{i}"]
        assert jobs.main([*argv, "--gateway", gateway.url, "--admin-key", ADMIN]) == 0
        rendered.append(capsys.readouterr().out)
        (ids[want],) = [
            r["id"] for r in gateway.admin.get("/api/rollouts", params={"group": f"g{i}"}).json()
        ]
    applied = subprocess.run(
        [kubectl, "apply", "-f", "-"], input="---\n".join(rendered), capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stderr
    for want, rid in ids.items():
        done = wait_status(gateway, rid, timeout=90)
        assert (done["status"], done["failure_kind"], done["reward"]) == want, reasons(gateway, rid)
        assert done["attempt"] == 1
    assert any("grader exited with 1" in r for r in reasons(gateway, ids["failed", "infra", None]))
    batch = client.BatchV1Api()
    core = client.CoreV1Api()
    deadline = time.monotonic() + 60
    # The TTL controller takes them; their Secrets stay.
    while batch.list_namespaced_job(namespace).items:
        assert time.monotonic() < deadline, "finished Jobs outlived their TTL"
        time.sleep(0.5)
    labelled = {"label_selector": "agl.dev/rollout"}
    assert len(core.list_namespaced_secret(namespace, **labelled).items) == len(ids)
    assert jobs.main(["gc", "--namespace", namespace, "--grace-s", "0"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(ids)
    assert not core.list_namespaced_secret(namespace, **labelled).items
