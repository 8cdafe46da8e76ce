"""The Helm chart: lint, template, and a real install into the local control plane (RBAC checked by the apiserver)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[1] / "helm" / "kubeinfer"

#: (verb, resource) pairs the operator needs, cluster-wide
OPERATOR_NEEDS = [
    ("watch", "inferencemodels.serving.kubeinfer.io"),
    ("patch", "inferencemodels.serving.kubeinfer.io/status"),
    ("patch", "inferenceservers.serving.kubeinfer.io/status"),
    ("patch", "inferencemodels.serving.kubeinfer.io"),  # finalizers
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("watch", "deployments.apps"),
    ("patch", "services"),
    ("delete", "horizontalpodautoscalers.autoscaling"),
    ("create", "events"),
    ("list", "namespaces"),
]


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_lint(helm) -> None:
    proc = helm("lint", str(CHART), "--strict")
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_template_renders_operator_with_leader_election(helm) -> None:
    docs = _docs(helm("template", "ki", str(CHART), "-n", "ops", "--set", "replicaCount=2").stdout)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "ServiceAccount"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert "--leader-election" in c["args"]
    assert "--repository-root=/var/lib/kubeinfer/models" in c["args"]
    assert "--claim-name=kubeinfer-models" in c["args"]
    assert "--max-artifact-bytes=21474836480" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "kubeinfer-models"
    with_pvc = _docs(helm("template", "ki", str(CHART), "--set", "repository.create=true").stdout)
    assert any(d["kind"] == "PersistentVolumeClaim" for d in with_pvc)
    refused = helm(
        "template", "ki", str(CHART), "--set", "replicaCount=2", "--set", "leaderElection=false", check=False
    )
    assert refused.returncode != 0 and "needs leaderElection" in refused.stderr


def test_install_into_the_cluster(cluster, helm, kubectl) -> None:
    ns = f"e2e-helm-{uuid.uuid4().hex[:6]}"
    release = "ki"
    try:
        helm("install", release, str(CHART), "-n", ns, "--create-namespace", "--set", "operator.watchNamespaces={a,b}")
        for crd in ("inferencemodels", "inferenceservers"):
            kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
        dep = json.loads(kubectl("-n", ns, "get", "deployment", f"{release}-kubeinfer-operator", "-o", "json").stdout)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--namespace=a" in args and "--namespace=b" in args
        sa = f"system:serviceaccount:{ns}:{release}-kubeinfer-operator"
        for verb, resource in OPERATOR_NEEDS:
            proc = kubectl("auth", "can-i", verb, resource, "--all-namespaces", "--as", sa, check=False)
            assert proc.stdout.strip() == "yes", f"operator cannot {verb} {resource}"
        lease = kubectl("auth", "can-i", "update", "leases.coordination.k8s.io", "-n", ns, "--as", sa, check=False)
        assert lease.stdout.strip() == "yes"
        assert kubectl("auth", "can-i", "delete", "secrets", "-n", ns, "--as", sa, check=False).stdout.strip() == "no"
        explained = kubectl("explain", "inferencemodel.spec.dynamicBatching").stdout
        assert "maxQueueDelayMicroseconds" in explained and "priorityQueuePolicy" in explained
        status = json.loads(helm("status", release, "-n", ns, "-o", "json").stdout)
        assert status["info"]["status"] == "deployed"
        helm("uninstall", release, "-n", ns)
        gone = kubectl("-n", ns, "get", "deployment", f"{release}-kubeinfer-operator", check=False)
        assert gone.returncode != 0
    finally:
        helm("uninstall", release, "-n", ns, check=False)
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
