"""The local cluster's add-on list, Prometheus's plugin list and the KEDA HTTP add-on's manifests (e2e/cluster/localcluster/addons/). The
add-ons themselves are built in CI's Go stage and run by the e2e suite (e2e/test_scale_to_zero.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.cluster.localcluster import addons
from e2e.cluster.localcluster.addons import keda_http, prometheus
from e2e.cluster.localcluster.base import ClusterError

ROOT = Path(__file__).resolve().parents[2]


def test_keda_http_brings_keda_along_in_start_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEINFER_CLUSTER_ADDONS", raising=False)
    assert addons.selected("keda-http") == ["keda", "keda-http"]
    assert addons.selected("keda-http, prometheus") == ["prometheus", "keda", "keda-http"]
    assert addons.selected(None) == []
    monkeypatch.setenv("KUBEINFER_CLUSTER_ADDONS", "keda-http")
    assert addons.selected(None) == ["keda", "keda-http"]
    with pytest.raises(ClusterError, match=r"unknown add-on\(s\) \['keda_http'\]; known: prometheus, keda, keda-http"):
        addons.selected("keda_http")


def _config(tmp_path: Path) -> Path:
    """A build folder's config/ laid out as keda_http_dir copies it, with the kinds the add-on's files hold."""
    for part in keda_http.KEDA_HTTP_PARTS:
        d = tmp_path / "config" / part
        d.mkdir(parents=True)
        (d / "service-account.yaml").write_text(f"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {part}\n")
        (d / "role.yaml").write_text(
            f"---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {part}\n"
            f"rules: []\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {part}\n"
            "rules: []\n"
        )
        (d / "role-binding.yaml").write_text(
            f"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {part}\n"
            f"roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {part}\n"
            f"subjects:\n  - kind: ServiceAccount\n    name: {part}\n"
            f"---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n"
            f"  name: {part}-auth-delegator\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n"
            f"  name: system:auth-delegator\nsubjects:\n  - kind: ServiceAccount\n    name: {part}\n"
        )
    crd = tmp_path / "config" / "crd"
    crd.mkdir()
    (crd / "http.keda.sh_interceptorroutes.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata:\n  name: interceptorroutes.http.keda.sh\n"
    )
    return tmp_path


def test_rbac_gets_the_kustomize_prefix_and_the_keda_namespace(tmp_path: Path) -> None:
    docs = keda_http.keda_http_rbac(_config(tmp_path))
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(by) == len(docs) == 15
    sa = by["ServiceAccount", "keda-add-ons-http-scaler"]
    assert sa["metadata"]["namespace"] == "keda"
    assert "namespace" not in by["ClusterRole", "keda-add-ons-http-scaler"]["metadata"]
    assert by["Role", "keda-add-ons-http-scaler"]["metadata"]["namespace"] == "keda"
    binding = by["ClusterRoleBinding", "keda-add-ons-http-interceptor"]
    assert binding["roleRef"]["name"] == "keda-add-ons-http-interceptor"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "keda-add-ons-http-interceptor", "namespace": "keda"}
    ]
    delegator = by["ClusterRoleBinding", "keda-add-ons-http-operator-auth-delegator"]
    assert delegator["roleRef"]["name"] == "system:auth-delegator"  # a built-in role keeps its name


def test_the_scaler_finds_the_interceptor_through_a_slice_on_the_host(tmp_path: Path) -> None:
    docs = [json.loads(d) for d in keda_http.keda_http_manifests(_config(tmp_path), "10.1.2.3", 4567).split("\n---\n")]
    assert docs[0]["metadata"]["name"] == "interceptorroutes.http.keda.sh"
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    (eps,) = [d for d in docs if d["kind"] == "EndpointSlice"]
    assert svc["metadata"] == {**svc["metadata"], "name": "keda-add-ons-http-interceptor-admin", "namespace": "keda"}
    assert "selector" not in svc["spec"]  # selectorless: the slice below is its only endpoint
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert eps["metadata"]["namespace"] == "keda"
    assert eps["endpoints"] == [{"addresses": ["10.1.2.3"], "conditions": {"ready": True}}]
    assert eps["ports"] == svc["spec"]["ports"] == [{"name": "admin", "port": 4567, "protocol": "TCP"}]


def test_prometheus_is_built_with_kubernetes_discovery_alone(tmp_path: Path) -> None:
    """The build replaces the module with a copy whose generated plugin list names only Kubernetes (upstream's
    ``make plugins`` from a one-line ``plugins.yml``); the scrape config's ``kubernetes_sd_configs`` needs it."""
    module = tmp_path / "mod" / "prometheus@v0.55.1"
    (module / "plugins").mkdir(parents=True)
    (module / "VERSION").write_text("2.55.1\n")
    upstream = '// This file is generated by "make plugins".\n\npackage plugins\n\nimport (\n'
    upstream += '\t// Register aws plugin.\n\t_ "github.com/prometheus/prometheus/discovery/aws"\n\n'
    upstream += '\t// Register kubernetes plugin.\n\t_ "github.com/prometheus/prometheus/discovery/kubernetes"\n)\n'
    (module / "plugins" / "plugins.go").write_text(upstream)
    for folder in (module / "plugins", module):
        folder.chmod(0o555)  # as the module cache leaves them
    (tmp_path / "build").mkdir()
    modfile = prometheus.plugins_modfile(module, tmp_path / "build")
    copy = tmp_path / "build" / "prometheus"
    assert (copy / "plugins" / "plugins.go").read_text() == upstream.replace(
        '\t// Register aws plugin.\n\t_ "github.com/prometheus/prometheus/discovery/aws"\n\n', ""
    )
    assert (module / "plugins" / "plugins.go").read_text() == upstream, "the module cache was written to"
    assert (copy / "VERSION").read_text() == "2.55.1\n"
    text = modfile.read_text()
    assert text.startswith((ROOT / "e2e" / "cluster" / "prometheus" / "go.mod").read_text())
    assert text.endswith(f"\nreplace github.com/prometheus/prometheus => {copy}\n")
    assert (tmp_path / "build" / "go.sum").read_bytes() == (ROOT / "e2e/cluster/prometheus/go.sum").read_bytes()
    # whatever else upstream's file holds, it must still be its generated plugin list
    (module / "plugins").chmod(0o755)
    (module / "plugins" / "plugins.go").unlink()
    (module / "plugins" / "plugins.go").write_text("package other\n")
    (tmp_path / "again").mkdir()
    with pytest.raises(RuntimeError, match="not Prometheus's generated plugin list"):
        prometheus.plugins_modfile(module, tmp_path / "again")
