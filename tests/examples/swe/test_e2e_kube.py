"""The SWE recipe end to end on the Kubernetes cluster KUBECONFIG names (CI: kube-local): the
controller's Job runs `harness.py` (real mini-SWE-agent) as the init container and `grade.py` as
the main container, sharing the workspace emptyDir. kube-local runs containers as host processes
(images are ignored), so the spec points at this checkout and the toy repository, as for local
processes; it stores the recipe's NetworkPolicy but enforces nothing (no CNI), so what is checked
here is that the API server accepts it and that it selects the rollout pods."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.controller.conftest import reasons
from tests.controller.test_kube import kube_launcher, namespace  # noqa: F401  (the fixture)
from tests.examples.swe.conftest import RECIPE, events, local_settings, recipe_stack, run_one
from tests.examples.swe.test_e2e_local import FIX
from tests.gateway.test_mini_swe_agent import SUBMIT, tool_call

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG names no cluster"),
]


def test_toy_task_as_a_job_under_the_network_policy(
    tiny_path: Path,
    tmp_path: Path,
    toy,
    namespace: str,  # noqa: F811
) -> None:
    from kubernetes import client

    policy = yaml.safe_load((RECIPE / "k8s" / "network-policy.yaml").read_text())
    client.NetworkingV1Api().create_namespaced_network_policy(namespace, policy)
    source, task = toy
    settings = local_settings(source, namespace=namespace, workspace=str(tmp_path / "ws"))
    peek = tool_call("git log --oneline")
    launcher = kube_launcher(namespace)
    script = [peek, FIX, tool_call(SUBMIT)]
    with recipe_stack(tiny_path, tmp_path, script, launcher, launcher="kubernetes") as s:
        done = run_one(s, task, settings)
        assert (done["status"], done["reward"]) == ("succeeded", 1.0), reasons(s, done["id"])
        assert [f["flag"] for f in events(s, done["id"], "flag")] == ["git_history"]
        selector = f"agl.dev/rollout={done['id']}"
        pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=selector)
    launcher.close()
    (pod,) = pods.items
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod.metadata.labels.items()
    (harness,), (grader,) = pod.spec.init_containers, pod.spec.containers
    assert str(RECIPE / "harness.py") in harness.command
    assert str(RECIPE / "grade.py") in grader.command
    assert "AGL_GRADER_TOKEN" not in {e.name for e in harness.env}
    assert "OPENAI_API_KEY" not in {e.name for e in grader.env}
    stored = client.NetworkingV1Api().read_namespaced_network_policy("agl-swe-rollouts", namespace)
    assert stored.spec.policy_types == ["Ingress", "Egress"] and len(stored.spec.egress) == 2
