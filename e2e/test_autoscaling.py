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
from kubeinfer.operator.traffic.autoscaling import quantity

from tests.support import processes
from tests.support.operator_logs import problems
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

    def start_operator(self, root: Path, prometheus_url: str, claim: str | None = None) -> None:
        """The operator as a host process; ``claim``: its own claim on ``root`` (in this namespace), from which
        it provides the pods' claim on this namespace's folder."""
        claim_args = ["--claim-name", claim, "--claim-namespace", self.name] if claim else []
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubeinfer.operator", "--kubeconfig", self.cluster.kubeconfig,
                 "--repository-root", str(root), "--namespace", self.name, "--resync-seconds", "3",
                 "--prometheus-url", prometheus_url, *claim_args],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip

    def stop_operator(self) -> None:
        if self.proc:
            processes.stop(self.proc)

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
        # a model left with the operator's finalizer would hold the namespace in Terminating forever (and
        # other tests' cluster-wide operators would find it there)
        cluster.release_finalizers(n.name)
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
    assert not problems(text), text[-4000:]


# ------------------------------------------------------------------------------------- under load, real pods

#: the example repository's cifar10_resnet, served under a Kubernetes-valid name
EXAMPLE = "cifar10_resnet"
MODEL = "cifar10-resnet"
#: average queue µs per request that the pool is scaled to; one request alone waits ~2000 µs (the model's
#: max_queue_delay_microseconds), a 2-core pod under 12 concurrent clients waits tens of milliseconds
QUEUE_TARGET_US = 20000
HEAVY_CLIENTS = 12


class Load:
    """Closed-loop clients through the Service's ClusterIP: tritonclient's binary-tensor request bodies over
    httpx, one connection per request (kube-proxy then spreads them over the ready pods; no keep-alive
    connection outlives its pod). Every answer is checked against onnxruntime in this process."""

    def __init__(self, url: str, x: Any, expected: Any) -> None:
        import threading

        import tritonclient.http as httpclient

        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = httpclient.InferRequestedOutput("output", binary_data=True)
        self.body, json_size = httpclient.InferenceServerClient.generate_request_body([inp], outputs=[out])
        self.headers = {"Inference-Header-Content-Length": str(json_size), "Content-Type": "application/octet-stream"}
        self.url = f"{url}/v2/models/{MODEL}/infer"
        self.expected = expected
        self.clients = 0  # how many of the worker threads send (the others idle)
        self.pause = 0.0  # seconds between a worker's requests
        self.ok = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(HEAVY_CLIENTS)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _worker(self, i: int) -> None:
        import time

        import numpy as np
        import tritonclient.http as httpclient

        with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            while not self._stop.is_set():
                if i >= self.clients:
                    time.sleep(0.05)
                    continue
                try:
                    r = client.post(self.url, content=self.body, headers=self.headers)
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
                    header = r.headers.get("Inference-Header-Content-Length")
                    result = httpclient.InferenceServerClient.parse_response_body(
                        r.content, header_length=int(header) if header else None
                    )
                    got = result.as_numpy("output")
                    if not np.allclose(got, self.expected, rtol=1e-3, atol=1e-4):
                        raise RuntimeError(f"wrong answer {got} != {self.expected}")
                    with self._lock:
                        self.ok += 1
                except Exception as exc:  # every failure counts; the test asserts there are none
                    with self._lock:
                        self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}")
                if self.pause:
                    time.sleep(self.pause)


def _prometheus(url: str, query: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"]["result"])


@pytest.mark.timeout(1200)
def test_pool_scales_up_under_load_and_back_without_failed_requests(
    cluster, node, images, metrics_stack, ns: Namespace, tmp_path: Path
) -> None:
    """min 1 / max 3 ResNet-18 pool on real pods: load through the Service → KEDA/HPA scale to 3 → the new pods
    are Ready and answer (their nv_inference_request_success grows) → load drops to one paced client → back
    to 1 replica, pods drained → not one failed or wrong answer over the whole run. Prints the timeline."""
    import threading
    import time

    import numpy as np
    import onnxruntime as ort
    from kubeinfer.server.examples.generate import default_repository

    # the repository volume: a claim bound to a host folder (the node's storage class), which the
    # operator -- a host process here -- writes; the server pods mount, read-only, the claim the operator
    # provides on this namespace's folder of it
    ns.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "kubeinfer-models"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }))  # fmt: skip
    wait_for("a default ServiceAccount", lambda: ns.get("serviceaccount", "default"), 60, 0.2)
    model_file = default_repository() / EXAMPLE / "1" / "model.onnx"

    # the claim binds when a pod uses it (WaitForFirstConsumer) or at once; the operator needs its folder
    def bound_folder() -> Path | None:
        pvc = ns.get("pvc", "kubeinfer-models") or {}
        if pvc.get("status", {}).get("phase") != "Bound":
            return None
        pv = cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
        return Path(pv["spec"]["hostPath"]["path"])

    server = {
        "apiVersion": API,
        "kind": "InferenceServer",
        "metadata": {"name": "resnet"},
        "spec": {
            "image": images["server"],
            "imagePullPolicy": "IfNotPresent",
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            "drainSeconds": 5,
            "probes": {"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1, "failureThreshold": 300}},
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 3,
                "target": {"metric": "QueueDurationPerRequest", "value": QUEUE_TARGET_US},
                "prometheus": {"window": "20s"},
                "pollingIntervalSeconds": 5,
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 0,
                                "policies": [{"type": "Percent", "value": 200, "periodSeconds": 5}]},
                    "scaleDown": {"stabilizationWindowSeconds": 15,
                                  "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]},
                },
            },
        },
    }  # fmt: skip
    ns.apply(server)
    folder = wait_for("the claim bound to a host folder", bound_folder, 120, 0.5, lambda: ns.describe("pvc"))
    ns.start_operator(folder, metrics_stack.prometheus_url, claim="kubeinfer-models")
    uploads = folder / ns.name / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    (uploads / "resnet18.onnx").write_bytes(model_file.read_bytes())
    ns.apply({
        "apiVersion": API, "kind": "InferenceModel", "metadata": {"name": MODEL},
        "spec": {
            "server": "resnet", "platform": "onnxruntime_onnx", "maxBatchSize": 8,
            "inputs": [{"name": "input", "dataType": "FP32", "format": "FORMAT_NCHW", "dims": [3, 32, 32]}],
            "outputs": [{"name": "output", "dataType": "FP32", "dims": [10]}],
            "dynamicBatching": {"maxQueueDelayMicroseconds": 2000},
            "instanceGroups": [{"count": 1, "kind": "KIND_CPU"}],
            "versions": [{"version": 1, "source": {"path": "uploads/resnet18.onnx"}}],
        },
    })  # fmt: skip

    svc = wait_for("the Service", lambda: ns.get("service", "resnet"), 60, 0.5, lambda: ns.describe("isrv"))
    base = f"http://{svc['spec']['clusterIP']}:8000"

    def model_ready() -> bool:
        try:
            return httpx.get(f"{base}/v2/models/{MODEL}/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for("the model Ready through the Service", model_ready, 300, 1, lambda: ns.describe("isrv,deploy,pods"))

    rng = np.random.default_rng(0)
    x = rng.random((1, 3, 32, 32), dtype=np.float32)
    expected = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]

    timeline: list[dict[str, Any]] = []
    sel = f'namespace="{ns.name}",serving_kubeinfer_io_server="resnet"'
    stop = threading.Event()

    def sample(load: Load) -> None:
        last_ok, last_t = 0, time.monotonic()
        t0 = last_t
        while not stop.wait(3):
            now = time.monotonic()
            isrv = ns.get("inferenceserver", "resnet") or {}
            hpa = ns.get("hpa", "keda-hpa-resnet") or {}
            status = hpa.get("status") or {}
            metrics = status.get("currentMetrics") or [{}]
            current = ((metrics[0].get("external") or {}).get("current") or {}).get("value")
            value = round(quantity(current)) if current else "-"  # the HPA's quantity, e.g. 300087033m µs
            pods = json.loads(ns.kubectl("get", "pods", "-l", "app.kubernetes.io/instance=resnet", "-o", "json").stdout)
            ready = sum(
                any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or ())
                for p in pods["items"]
            )
            per_pod = {
                r["metric"]["pod"].rsplit("-", 1)[-1]: int(float(r["value"][1]))
                for r in _prometheus(metrics_stack.prometheus_url,
                                     f"sum by (pod) (nv_inference_request_success{{{sel}}})")
            }  # fmt: skip
            ok = load.ok
            timeline.append({
                "t": round(now - t0), "clients": load.clients, "replicas": isrv.get("spec", {}).get("replicas"),
                "desired": status.get("desiredReplicas", "-"),
                "pods": len(pods["items"]), "ready": ready, "queue_us": value,
                "req/s": round((ok - last_ok) / (now - last_t), 1), "failed": len(load.failures),
                "success_by_pod": per_pod,
            })  # fmt: skip
            last_ok, last_t = ok, now

    def table() -> str:
        head = (
            f"{'t':>5} {'clients':>7} {'replicas':>8} {'desired':>7} {'pods':>4} {'ready':>5} {'queue_us':>9} "
            f"{'req/s':>6} {'failed':>6}  success by pod"
        )
        rows = [
            f"{r['t']:>5} {r['clients']:>7} {r['replicas']!s:>8} {r['desired']!s:>7} {r['pods']:>4} {r['ready']:>5} "
            f"{r['queue_us']!s:>9} "
            f"{r['req/s']:>6} {r['failed']:>6}  {r['success_by_pod']}"
            for r in timeline
        ]
        return "\n".join([head, *rows])

    def replicas(n: int) -> bool:
        isrv = ns.get("inferenceserver", "resnet") or {}
        return (isrv.get("status") or {}).get("readyReplicas") == n and isrv["spec"].get("replicas") == n

    def describe() -> str:
        return table() + "\n" + ns.describe("isrv,hpa,scaledobject,pods")

    with Load(base, x, expected) as load:
        sampler = threading.Thread(target=sample, args=(load,), daemon=True)
        sampler.start()
        try:
            load.clients = HEAVY_CLIENTS
            wait_for("scale-up to 3 Ready replicas under load", lambda: replicas(3), 420, 1, describe)

            # the new pods take traffic: every pod's success counter grows while the load goes on
            def all_pods_serving() -> dict | None:
                counts = {
                    r["metric"]["pod"]: float(r["value"][1])
                    for r in _prometheus(metrics_stack.prometheus_url,
                                         f"sum by (pod) (increase(nv_inference_request_success{{{sel}}}[20s]))")
                }  # fmt: skip
                return counts if len(counts) == 3 and all(v > 0 for v in counts.values()) else None

            serving = wait_for("all three pods answering", all_pods_serving, 120, 2, describe)
            assert len(serving) == 3

            # load drops to one paced client: the queue empties, the pool goes back to one pod while
            # requests keep flowing (the pods being removed drain first)
            load.clients, load.pause = 1, 0.2
            wait_for("scale-down to 1 replica", lambda: replicas(1), 420, 1, describe)
            wait_for(
                "the removed pods gone",
                lambda: len(json.loads(ns.kubectl("get", "pods", "-l", "app.kubernetes.io/instance=resnet",
                                                  "-o", "json").stdout)["items"]) == 1,
                180, 1, describe,
            )  # fmt: skip
            wait_for("a sample with the single pod", lambda: bool(timeline) and timeline[-1]["pods"] == 1, 30, 0.5)
        finally:
            stop.set()
            sampler.join(10)
    report = table() + f"\nrequests: {load.ok} answered right, {len(load.failures)} failed"
    print(f"\nautoscaling timeline (queue target {QUEUE_TARGET_US} µs):\n{report}")
    assert not load.failures, f"{len(load.failures)} failed requests:\n" + "\n".join(load.failures[:20]) + "\n" + report
    assert load.ok > 100, report
    assert max(r["replicas"] or 0 for r in timeline) == 3, report
    st = ns.get("inferenceserver", "resnet")["status"]
    assert st["autoscaling"]["autoscaler"] == "KEDA" and st["autoscaling"]["hpa"] == "keda-hpa-resnet"
    scaled = [e for e in json.loads(ns.kubectl("get", "events", "-o", "json").stdout)["items"]
              if e.get("reason") == "SuccessfulRescale"]  # fmt: skip
    assert len(scaled) >= 2, "the HPA never rescaled (events)"
