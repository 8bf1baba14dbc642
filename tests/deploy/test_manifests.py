"""The kustomize stack in deploy/ renders, validates, applies to a 1.20 API server and matches the CLI.

- `kubectl kustomize deploy/` renders the expected objects (gateway Deployment with 2 replicas and
  its Service, the PostgreSQL StatefulSet and its headless Service, the controller's Deployment,
  ServiceAccount, Role and RoleBinding, the generated Secret), with API versions a 1.20 server
  serves; every agl container runs the image the `images:` entry names, and every Secret reference
  names a key of the generated Secret.
- Every object passes kubernetes-validate's strict schema: 1.20's where the library has it (1.37.0
  starts at 1.25, so its oldest), and its newest. 1.20's own schema is checked by the dry-run.
- The flags the Deployments pass to `agl gateway` and `agl controller` are in their `--help`, and the
  `AGL_*` variables they set are fields of those commands' settings: the manifests cannot drift
  from the CLI.
- The controller's Role grants exactly the API calls controller/kube.py makes, no more.
- With KUBECONFIG (CI: kube-local, Kubernetes 1.20): `kubectl apply --dry-run=server
  --validate=strict -k deploy/` into a fresh namespace succeeds (kubectl checks each field against
  the server's OpenAPI, since 1.20 has no server-side field validation), and the Kubernetes
  launcher, authenticated as the controller's ServiceAccount, launches, watches, stops and
  collects its Jobs and Secrets with no refusal.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE_PY = ROOT / "controller" / "kube.py"
SECRET = "agl-secrets"
# Group versions a Kubernetes 1.20 API server serves that such a stack might use (not policy/v1,
# autoscaling/v2, batch/v1 CronJob: 1.21 and later).
SERVED_BY_1_20 = {
    "v1",
    "apps/v1",
    "batch/v1",
    "batch/v1beta1",
    "rbac.authorization.k8s.io/v1",
    "policy/v1beta1",
    "networking.k8s.io/v1",
    "autoscaling/v1",
    "autoscaling/v2beta2",
}
EXPECTED = {
    ("Deployment", "agl-gateway"),
    ("Service", "agl-gateway"),
    ("StatefulSet", "agl-postgres"),
    ("Service", "agl-postgres"),
    ("Deployment", "agl-controller"),
    ("ServiceAccount", "agl-controller"),
    ("Role", "agl-controller"),
    ("RoleBinding", "agl-controller"),
    ("Secret", SECRET),
}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (it renders deploy/ with its built-in kustomize)")
    return found


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def only(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def secret_of(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == "Secret"]
    return found


def container(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = only(objs, kind, name)["spec"]["template"]["spec"]["containers"]
    return found


def pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objs if "template" in o.get("spec", {})]


# ---------------------------------------------------------------------------- rendering


def test_the_stack_renders_the_expected_objects(rendered: list[dict[str, Any]]) -> None:
    found = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    secret = secret_of(rendered)["metadata"]["name"]
    assert re.fullmatch(rf"{SECRET}-[a-z0-9]+", secret), secret  # the generator's hash suffix
    assert {(k, SECRET if k == "Secret" else n) for k, n in found} == EXPECTED
    assert len(rendered) == len(EXPECTED)
    assert all("namespace" not in o["metadata"] for o in rendered)  # `kubectl apply -n` picks it
    bad = {o["apiVersion"] for o in rendered} - SERVED_BY_1_20
    assert not bad, f"API versions a 1.20 server does not serve: {bad}"

    gateway = only(rendered, "Deployment", "agl-gateway")
    assert gateway["spec"]["replicas"] == 2
    assert only(rendered, "Deployment", "agl-controller")["spec"]["replicas"] == 1
    service = only(rendered, "Service", "agl-gateway")["spec"]
    assert service.get("type", "ClusterIP") == "ClusterIP"
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    gw = container(rendered, "Deployment", "agl-gateway")
    assert (
        [p["containerPort"] for p in gw["ports"]] == [8000] == [p["port"] for p in service["ports"]]
    )
    for probe in ("readinessProbe", "livenessProbe"):
        assert gw[probe]["httpGet"]["path"] == "/healthz", probe
    assert gw["resources"]["requests"]

    postgres = only(rendered, "StatefulSet", "agl-postgres")["spec"]
    assert postgres["serviceName"] == "agl-postgres" and postgres["volumeClaimTemplates"]
    assert only(rendered, "Service", "agl-postgres")["spec"]["clusterIP"] == "None"  # headless
    assert container(rendered, "StatefulSet", "agl-postgres")["image"] == "postgres:16"

    binding = only(rendered, "RoleBinding", "agl-controller")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "agl-controller",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agl-controller"}]
    controller_pod = only(rendered, "Deployment", "agl-controller")["spec"]["template"]["spec"]
    assert controller_pod["serviceAccountName"] == "agl-controller"


def test_every_agl_container_runs_the_image_named_in_kustomization(
    rendered: list[dict[str, Any]],
) -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    (entry,) = [i for i in kustomization["images"] if i["name"] == "agl"]
    image = f"{entry['newName']}:{entry['newTag']}"
    containers = [c for spec in pod_specs(rendered) for c in spec["containers"]]
    agl = [c for c in containers if c.get("command", [""])[0] == "agl"]
    assert {c["name"] for c in agl} == {"gateway", "controller"}
    assert {c["image"] for c in agl} == {image}
    sources = "".join(p.read_text() for p in DEPLOY.glob("*.yaml"))
    assert sources.count("image: agl\n") == len(agl)  # the placeholder, which `images:` rewrites


def test_secret_references_name_keys_of_the_generated_secret(
    rendered: list[dict[str, Any]],
) -> None:
    secret = secret_of(rendered)
    keys = set(secret["data"])
    assert {"admin-key", "postgres-password", "store-url"} <= keys
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert all("change-me" in v for v in values.values())  # placeholders, nothing real
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for spec in pod_specs(rendered)
        for c in spec["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert refs
    for ref in refs:
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in keys or ref.get("optional"), ref


def test_objects_pass_strict_schema_validation(rendered: list[dict[str, Any]]) -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions

    versions = all_versions()
    oldest = "1.20.0" if "1.20.0" in versions else versions[0]
    for version in (oldest, kubernetes_validate.latest_version()):
        for obj in rendered:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(map(str, e.path))
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {path}: {e}")


# ---------------------------------------------------------------------------- the CLI


def flags_of(command: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agl.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return set(re.findall(r"^\s+(--[a-z0-9-]+)", done.stdout, re.MULTILINE))


@pytest.mark.parametrize(
    ("deployment", "command"), [("agl-gateway", "gateway"), ("agl-controller", "controller")]
)
def test_flags_and_variables_exist_in_the_cli(
    rendered: list[dict[str, Any]], deployment: str, command: str
) -> None:
    from agl.settings import StoreSettings
    from controller.loop import ControllerSettings
    from gateway.settings import GatewaySettings

    c = container(rendered, "Deployment", deployment)
    assert c["command"] == ["agl"] and c["args"][0] == command
    passed = {arg.split("=", 1)[0] for arg in c["args"][1:]}
    assert all(arg.startswith("--") for arg in passed), c["args"]
    assert passed, c["args"]
    unknown = passed - flags_of(command)
    assert not unknown, f"`agl {command}` has no {sorted(unknown)}"
    settings = {
        "AGL_GATEWAY_": GatewaySettings,
        "AGL_CONTROLLER_": ControllerSettings,
        "AGL_STORE_": StoreSettings,
    }
    for env in c.get("env", []):
        name = env["name"]
        if not name.startswith("AGL_"):
            continue
        (prefix,) = [p for p in settings if name.startswith(p)]
        assert name.removeprefix(prefix).lower() in settings[prefix].model_fields, name


def test_the_controller_runs_the_kubernetes_launcher_against_the_gateway_service(
    rendered: list[dict[str, Any]],
) -> None:
    args = container(rendered, "Deployment", "agl-controller")["args"]
    assert "--launcher=kubernetes" in args
    gw_args = container(rendered, "Deployment", "agl-gateway")["args"]
    port = only(rendered, "Service", "agl-gateway")["spec"]["ports"][0]["port"]
    url = f"http://agl-gateway:{port}"
    assert f"--gateway={url}" in args and f"--public-url={url}" in gw_args
    assert f"--port={port}" in gw_args and "--host=0.0.0.0" in gw_args


# ---------------------------------------------------------------------------- RBAC


def launcher_needs() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every Kubernetes call in controller/kube.py."""
    source = KUBE_PY.read_text()
    verbs = {"create": "create", "read": "get", "list": "list", "replace": "update"}
    verbs |= {"patch": "patch", "delete": "delete"}
    needs = set()
    for api, method in re.findall(r"self\.(core|batch)\.(\w+)", source):
        m = re.fullmatch(r"(create|read|list|replace|patch|delete)_namespaced_(\w+)", method)
        assert m, f"controller/kube.py calls {api}.{method}: give the controller's Role its verb"
        kind, _, sub = m[2].partition("_")
        resource = kind + "s" + (f"/{sub}" if sub else "")
        needs.add(("batch" if api == "batch" else "", resource, verbs[m[1]]))
    for api, method in re.findall(
        r"Watch\(\)\.stream\(\s*self\.(core|batch)\.list_namespaced_(\w+)", source
    ):
        needs.add(("batch" if api == "batch" else "", method + "s", "watch"))
    return needs


def test_the_role_grants_exactly_what_the_kubernetes_launcher_calls(
    rendered: list[dict[str, Any]],
) -> None:
    needs = launcher_needs()
    assert ("batch", "jobs", "watch") in needs and ("", "secrets", "create") in needs
    granted = {
        (group, resource, verb)
        for rule in only(rendered, "Role", "agl-controller")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == needs, f"missing {needs - granted}, not needed {granted - needs}"


# ---------------------------------------------------------------------------- a real API server


def cluster() -> str:
    if not os.environ.get("KUBECONFIG"):
        pytest.skip("KUBECONFIG names no cluster")
    return kubectl()


def run(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture
def namespace() -> Iterator[str]:
    tool = cluster()
    name = f"agl-deploy-{uuid.uuid4().hex[:8]}"
    run(tool, "create", "namespace", name)
    yield name
    run(tool, "delete", "namespace", name, "--wait=false")


@pytest.mark.k8s
def test_server_side_dry_run_applies_the_stack(namespace: str) -> None:
    out = run(
        cluster(),
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-k",
        str(DEPLOY),
        "-n",
        namespace,
    )
    created = {
        line.split()[0].split(".")[0] for line in out.splitlines() if "(server dry run)" in line
    }
    kinds = {kind.lower() for kind, _ in EXPECTED}
    assert {c.split("/")[0] for c in created} == kinds, out


def service_account_client(tool: str, namespace: str, rendered: list[dict[str, Any]]) -> Any:
    """A client authenticated as the controller's ServiceAccount, its RBAC objects applied."""
    from kubernetes import client, config

    rbac = [o for o in rendered if o["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    run(tool, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(rbac))
    get = [tool, "get", "-n", namespace, "-o"]
    deadline = time.monotonic() + 30
    while not (name := run(*get, "jsonpath={.secrets[0].name}", "sa", "agl-controller")):
        assert time.monotonic() < deadline, "no token Secret for the ServiceAccount"
        time.sleep(0.2)
    token = run(*get, "jsonpath={.data.token}", "secret", name)  # 1.20 makes one per account
    cfg = client.Configuration()
    config.load_kube_config(client_configuration=cfg)
    cfg.refresh_api_key_hook = None  # else the kubeconfig's own token comes back before each call
    cfg.api_key = {"authorization": "Bearer " + base64.b64decode(token).decode()}
    return client.ApiClient(cfg)


@pytest.mark.k8s
def test_the_launcher_works_as_the_controllers_service_account(
    rendered: list[dict[str, Any]], namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from controller.kube import KubeLauncher
    from controller.launcher import AttemptKey, Credentials
    from controller.outcome import RAN
    from controller.spec import parse_spec

    tool = cluster()
    api = service_account_client(tool, namespace, rendered)
    with pytest.raises(ApiException) as refused:  # really the ServiceAccount, not the admin
        client.CoreV1Api(api).list_namespaced_config_map(namespace)
    assert refused.value.status == 403
    launcher = KubeLauncher(namespace, pod_check_s=0.0, secret_grace_s=0.0)
    admin = client.CoreV1Api()  # the kubeconfig's user, which KubeLauncher loaded
    launcher.api, launcher.batch, launcher.core = api, client.BatchV1Api(api), client.CoreV1Api(api)
    spec = {"namespace": namespace, "workspace": str(tmp_path / "ws")}
    quick = parse_spec(spec | {"harness": {"command": ["true"], "timeout_s": 60}})
    slow = parse_spec(spec | {"harness": {"command": ["sleep", "300"], "timeout_s": 600}})
    rid = "deploy" + uuid.uuid4().hex[:8]

    def creds(attempt: int) -> Credentials:
        return Credentials(rid, attempt, {}, "http://gw:8000", "http://gw:8000/v1", "t", "g")

    async def exercise() -> list[str]:
        assert await launcher.adopt() == []  # list and watch Jobs
        await launcher.launch(quick, creds(1))  # Secret, Job, the Secret's owner
        await launcher.launch(quick, creds(1))  # again: replaces the Secret, reads the Job
        deadline = time.monotonic() + 60
        while not (ended := dict(await launcher.poll())):  # lists pods and Secrets
            assert time.monotonic() < deadline, "the Job did not end"
            await asyncio.sleep(0.2)
        assert ended == {(rid, 1): RAN}
        await launcher.launch(slow, creds(2))
        await launcher.stop(AttemptKey(rid, 2))  # deletes the Job
        orphan = {
            "metadata": {
                "name": "orphan",
                "labels": {"agl.dev/rollout": "x", "agl.dev/attempt": "1"},
            }
        }
        admin.create_namespaced_secret(namespace, orphan)
        return await launcher.collect()  # deletes the Secret whose Job is gone

    caplog.set_level(logging.WARNING)
    try:
        assert asyncio.run(exercise()) == ["orphan"]
    finally:
        launcher.close()
    jobs = client.BatchV1Api().list_namespaced_job(namespace).items
    assert [j.metadata.name for j in jobs if not j.metadata.deletion_timestamp] == [f"agl-{rid}-1"]
    secret = admin.read_namespaced_secret(f"agl-{rid}-1", namespace)
    assert secret.metadata.owner_references[0].kind == "Job"
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
