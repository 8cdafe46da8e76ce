"""Autoscaling for real: Prometheus (Debian's package) and KEDA (built from its Go module) on the local cluster,
the operator's ScaledObject → KEDA's HPA → the HPA controller reading KEDA's external metrics API, which
KEDA answers with a Prometheus query. Nothing is stubbed: every hop is the real component.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
#: the fake node: kwok reports the pods Running/Ready (with a made-up IP) without running anything
ON_KWOK = {"nodeSelector": {"type": "kwok"}, "tolerations": [{"operator": "Exists"}]}


class Namespace:
    """A test namespace with the operator running on it (host process, admin kubeconfig)."""

    def __init__(self, cluster: Any, name: str, log: Path) -> None:
        self.cluster, self.name, self.log = cluster, name, log
        self.proc: subprocess.Popen[bytes] | None = None

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", self.name, *args, check=check, input=input)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        proc = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def start_operator(self, root: Path, prometheus_url: str) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubeinfer.operator", "--kubeconfig", self.cluster.kubeconfig,
                 "--repository-root", str(root), "--namespace", self.name, "--resync-seconds", "3",
                 "--prometheus-url", prometheus_url],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip

    def stop_operator(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def describe(self, *what: str) -> str:
        out = [self.kubectl("get", *what, "-o", "yaml", check=False).stdout]
        out.append(self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "")
        return "\n".join(out)


@pytest.fixture
def ns(cluster: Any, tmp_path: Path) -> Iterator[Namespace]:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    n = Namespace(cluster, f"e2e-as-{uuid.uuid4().hex[:6]}", tmp_path / "operator.log")
    cluster.kubectl("create", "namespace", n.name)
    try:
        yield n
    finally:
        n.stop_operator()
        cluster.kubectl("delete", "namespace", n.name, "--wait=false", check=False)


def test_prometheus_discovers_annotated_pods_and_the_external_metrics_api_is_served(
    cluster, metrics_stack, ns: Namespace
) -> None:
    """Prometheus finds pods by the prometheus.io annotations through pod service discovery and keeps the
    labels the autoscaling queries select on; the apiserver serves external.metrics.k8s.io through KEDA's
    adapter (an aggregated API server)."""
    prom = metrics_stack.prometheus_url
    assert metrics_stack.prometheus_version.startswith("2.")
    assert httpx.get(f"{prom}/-/ready", timeout=5).status_code == 200
    wait_for("default ServiceAccount", lambda: ns.get("serviceaccount", "default"), 30, 0.2)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "annotated",
            "labels": {"serving.kubeinfer.io/server": "pool-x"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8002"},
        },
        "spec": {
            "containers": [{"name": "c", "image": "kubeinfer-server:test", "ports": [{"containerPort": 8002}]}],
            **ON_KWOK,
        },
    }
    ns.apply(pod)
    ns.apply({**pod, "metadata": {"name": "not-annotated", "labels": pod["metadata"]["labels"]}})

    def target() -> dict | None:
        active = httpx.get(f"{prom}/api/v1/targets", params={"state": "active"}, timeout=5).json()["data"]
        mine = [t for t in active["activeTargets"] if t["labels"].get("namespace") == ns.name]
        return mine[0] if mine else None

    t = wait_for("the annotated pod as a scrape target", target, 60, 1)
    ip = ns.get("pod", "annotated")["status"]["podIP"]
    assert t["scrapeUrl"] == f"http://{ip}:8002/metrics"
    assert t["labels"]["pod"] == "annotated" and t["labels"]["serving_kubeinfer_io_server"] == "pool-x"
    assert t["scrapePool"] == "kubernetes-pods"
    active = httpx.get(f"{prom}/api/v1/targets", params={"state": "active"}, timeout=5).json()["data"]
    assert not [x for x in active["activeTargets"] if x["labels"].get("pod") == "not-annotated"]

    service = cluster.kubectl_json("get", "apiservice", "v1beta1.external.metrics.k8s.io")
    available = next(c for c in service["status"]["conditions"] if c["type"] == "Available")
    assert available["status"] == "True", available
    discovery = json.loads(cluster.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1").stdout)
    assert discovery["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert metrics_stack.keda_version == "v2.21.0"


def test_scaled_object_feeds_the_hpa_through_keda(cluster, metrics_stack, ns: Namespace, tmp_path: Path) -> None:
    """The operator renders a ScaledObject; KEDA makes keda-hpa-<name>; the HPA controller reads the metric
    through the apiserver → KEDA adapter → KEDA operator → Prometheus and reports it; the InferenceServer's
    status shows the autoscaler. Then switching to a plain HPA and off again cleans up after itself."""
    ns.start_operator(tmp_path, metrics_stack.prometheus_url)
    server = {
        "apiVersion": API,
        "kind": "InferenceServer",
        "metadata": {"name": "pool"},
        "spec": {
            "image": "kubeinfer-server:test",
            "repository": {"claimName": "kubeinfer-models"},
            **ON_KWOK,
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 3,
                "target": {"metric": "PendingRequests", "value": 4},
                "pollingIntervalSeconds": 5,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}},
            },
        },
    }
    ns.apply(server)
    so = wait_for("ScaledObject", lambda: ns.get("scaledobject", "pool"), 60, 0.5, lambda: ns.describe("isrv"))
    assert so["metadata"]["ownerReferences"][0]["kind"] == "InferenceServer"
    trigger = so["spec"]["triggers"][0]
    assert trigger["metadata"]["serverAddress"] == metrics_stack.prometheus_url
    assert f'namespace="{ns.name}"' in trigger["metadata"]["query"]

    def hpa_reads_metric() -> dict | None:
        hpa = ns.get("hpa", "keda-hpa-pool")
        st = (hpa or {}).get("status") or {}
        active = next((c for c in st.get("conditions") or () if c["type"] == "ScalingActive"), {})
        return hpa if active.get("status") == "True" and st.get("currentMetrics") else None

    hpa = wait_for(
        "KEDA's HPA reading the external metric", hpa_reads_metric, 150, 1, lambda: ns.describe("hpa,scaledobject")
    )
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": API, "kind": "InferenceServer", "name": "pool"}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 5
    metric = hpa["status"]["currentMetrics"][0]
    assert metric["type"] == "External"
    assert metric["external"]["current"]["averageValue"] == "0"  # no server pod has pending requests
    assert "app.kubernetes.io/managed-by" not in hpa["metadata"]["labels"] or (
        hpa["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "keda-operator"
    )

    def reported() -> dict | None:
        st = (ns.get("inferenceserver", "pool") or {}).get("status") or {}
        cond = next((c for c in st.get("conditions") or () if c["type"] == "AutoscalingReady"), {})
        auto = st.get("autoscaling") or {}
        return st if cond.get("status") == "True" and auto.get("currentMetricValues") else None

    st = wait_for("autoscaling status", reported, 60, 0.5, lambda: ns.describe("isrv"))
    auto = st["autoscaling"]
    assert (auto["autoscaler"], auto["kind"], auto["hpa"]) == ("KEDA", "ScaledObject", "keda-hpa-pool")
    assert auto["currentReplicas"] == 1 and auto["desiredReplicas"] == 1
    assert auto["threshold"] == "4" and "nv_inference_pending_request_count" in auto["query"]

    # a plain HPA instead: the ScaledObject goes (and KEDA removes its HPA), ours comes
    server["spec"]["autoscaling"] = {"autoscaler": "HPA", "maxReplicas": 3, "target": {"metric": "PendingRequests"}}
    ns.apply(server)
    wait_for("ScaledObject deleted", lambda: ns.get("scaledobject", "pool") is None, 60, 0.5)
    wait_for("KEDA's HPA deleted", lambda: ns.get("hpa", "keda-hpa-pool") is None, 60, 0.5)
    ours = wait_for("the operator's HPA", lambda: ns.get("hpa", "pool"), 60, 0.5)
    assert ours["spec"]["metrics"][0]["pods"]["metric"]["name"] == "nv_inference_pending_request_count"
    # autoscaling off: nothing left
    ns.kubectl("patch", "isrv", "pool", "--type=json", "-p", '[{"op": "remove", "path": "/spec/autoscaling"}]')
    wait_for("HPA deleted", lambda: ns.get("hpa", "pool") is None, 60, 0.5)
    st = wait_for(
        "status without autoscaling",
        lambda: "autoscaling" not in ((ns.get("inferenceserver", "pool") or {}).get("status") or {"autoscaling": 1}),
        60,
        0.5,
    )
    text = ns.log.read_text()
    assert " ERROR " not in text, text[-4000:]
