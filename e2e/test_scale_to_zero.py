"""Scale to zero for real: ``autoscaling.minReplicas: 0`` through KEDA and KEDA's HTTP add-on (built from its Go
module, e2e/cluster/localcluster/addons/keda_http.py) on the local cluster's real node.

The operator (a host process, this tree's code) renders the add-on's InterceptorRoutes and the ScaledObject
with its external-push triggers; KEDA scales the idle pool to zero pods; a request sent to the add-on's
interceptor for the pool's host is held while KEDA wakes the pool (interceptor → external scaler → KEDA →
the InferenceServer's scale subresource → the operator's Deployment → a pod that loads the model) and then
answered. The time from the request to its answer is measured for HTTP and for gRPC (tritonclient, HTTP/2
through the interceptor) and printed with the woken pod's start-up phases. The chart's dashboard counts each wake:
its "Wakes from zero" panel's query, sent to the real Prometheus as Grafana sends it, goes up by exactly one.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from dashboard_queries import WAKES, instant, panel_query
from kubeinfer.server.examples.generate import default_repository

from tests.support.host_operator import HostOperator, InNamespace, host_operator, pool_server
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

API = "serving.kubeinfer.io/v1alpha1"
POOL = "idle-pool"
MODEL = "add-sub"
#: seconds without requests before KEDA scales the pool to zero (the add-on's default is 300)
IDLE_SECONDS = 15
#: the pool's bearer token: a pool that scales to zero must have one (the interceptor is shared)
TOKEN = "e2e-zero-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: longest wait for one answer from zero: a pod's scheduling, container start and model load on 2 busy cores
FIRST_ANSWER_LIMIT = 300.0


@dataclass
class Pool(InNamespace):
    op: HostOperator
    host: str
    prometheus: str

    def pods(self) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={POOL}", "-o", "json").stdout
        return list(json.loads(out)["items"])

    def describe(self) -> str:
        out = self.kubectl("get", "isrv,deploy,pods,scaledobject,interceptorroute,hpa", "-o", "yaml", check=False)
        return out.stdout[-12000:] + "\n--- operator log\n" + self.op.log.read_text(errors="replace")[-4000:]

    def wakes(self) -> float:
        """The dashboard's "Wakes from zero" stat for this pool (0 while it has no series)."""
        answer = instant(self.prometheus, panel_query(WAKES, {"namespace": self.ns, "server": POOL}))
        assert answer.get("status") == "success", answer
        return sum(float(r["value"][1]) for r in answer["data"]["result"])

    def scraped(self) -> bool:
        """Whether Prometheus has a scrape target of the pool now (its up series, not yet stale)."""
        answer = instant(self.prometheus, f'up{{namespace="{self.ns}", serving_kubeinfer_io_server="{POOL}"}}')
        assert answer.get("status") == "success", answer
        return bool(answer["data"]["result"])


def _condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == ctype), {})


@pytest.fixture(scope="module")
def pool(
    cluster: Any, node: dict, images: dict, http_addon: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pool]:
    args = ("--prometheus-url", http_addon.prometheus_url, "--keda-http-scaler-address", http_addon.scaler_address)
    with host_operator(cluster, node, "e2e-zero", tmp_path_factory.mktemp("scale-to-zero"), args) as op:
        uploads = op.uploads()
        (uploads / "add_sub.onnx").write_bytes((default_repository() / "add_sub" / "1" / "model.onnx").read_bytes())
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "pool-token"},
            "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
        }
        server = pool_server(
            POOL, images,
            auth={"tokenSecret": {"name": "pool-token"}},
            drainSeconds=1,
            probes={"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1, "failureThreshold": 300}},
            autoscaling={
                "minReplicas": 0,
                "maxReplicas": 2,
                "pollingIntervalSeconds": 2,
                "target": {"metric": "PendingRequests", "value": "10"},
                "scaleToZero": {"idleSeconds": IDLE_SECONDS},
            },
        )  # fmt: skip
        model = {
            "apiVersion": API,
            "kind": "InferenceModel",
            "metadata": {"name": MODEL},
            "spec": {
                "server": POOL, "platform": "onnxruntime_onnx", "maxBatchSize": 8,
                "inputs": [{"name": n, "dataType": "FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
                "outputs": [{"name": n, "dataType": "FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
                "instanceGroups": [{"count": 1, "kind": "KIND_CPU"}],
                "versions": [{"version": 1, "source": {"path": "uploads/add_sub.onnx"}}],
            },
        }  # fmt: skip
        p = Pool(cluster, op.ns, op, f"{POOL}.{op.ns}", http_addon.prometheus_url)
        items = [secret, server, model]
        p.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        yield p


def _at_zero(pool: Pool) -> bool:
    isrv = pool.get("inferenceserver", POOL)
    return isrv.get("spec", {}).get("replicas") == 0 and not pool.pods()


PHASES = ("scheduled", "containerStarted", "listening", "modelsReady")


def _woken_pod(pool: Pool) -> dict[str, Any]:
    """The status.pods entry of the pod that answered (the pool's only one), once its timeline is complete."""

    def complete() -> dict[str, Any] | None:
        pods = (pool.get("inferenceserver", POOL).get("status") or {}).get("pods") or []
        if len(pods) == 1 and all(k in (pods[0].get("seconds") or {}) for k in PHASES):
            return dict(pods[0])
        return None

    return wait_for_cluster("the woken pod's start-up timeline in status.pods", complete, 60, describe=pool.describe)


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _idle_for_prometheus(pool: Pool) -> float:
    """Waits until Prometheus too has the pool at zero (its discovery dropped the last pod) for longer than the
    wakes panel's 5 s step, which counts a return from there; then the panel's count."""
    wait_for_cluster("Prometheus without a target of the pool", lambda: not pool.scraped(), 60, describe=pool.describe)
    time.sleep(6)
    return pool.wakes()


def _counted(pool: Pool, before: float) -> float:
    """The wakes panel's count once it has gone past ``before`` (the new pod scraped, the next 5 s step)."""
    return wait_for_cluster(
        "the dashboard's wakes panel counting the wake", lambda: (n := pool.wakes()) > before and n, 90, 2,
        describe=pool.describe,
    )  # fmt: skip


def _with_condition(pool: Pool, kind: str, name: str, ctype: str) -> dict[str, Any] | None:
    obj = pool.get(kind, name)
    return obj if _condition(obj, ctype).get("status") == "True" else None


def test_scale_from_zero_with_the_first_request_answered(pool: Pool, http_addon: Any) -> None:
    """The operator's objects → KEDA takes the idle pool to zero → one HTTP request through the interceptor
    wakes it and gets the right answer (timed) → idle again → one gRPC request does the same (timed)."""
    isrv = wait_for_cluster(
        "ScaleToZero True on the InferenceServer",
        lambda: _with_condition(pool, "inferenceserver", POOL, "ScaleToZero"), 180, describe=pool.describe,
    )  # fmt: skip
    scale = isrv["status"]["autoscaling"]
    assert scale["autoscaler"] == "KEDA"
    assert scale["scaleToZero"]["routes"] == [f"{POOL}-http", f"{POOL}-grpc"]
    assert pool.host in scale["scaleToZero"]["hosts"] and scale["scaleToZero"]["idleSeconds"] == IDLE_SECONDS
    assert pool.host in _condition(isrv, "ScaleToZero")["message"]
    so = pool.get("scaledobject", POOL)
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["cooldownPeriod"] == IDLE_SECONDS
    pushes = [t for t in so["spec"]["triggers"] if t["type"] == "external-push"]
    assert [t["metadata"] for t in pushes] == [
        {"scalerAddress": http_addon.scaler_address, "interceptorRoute": f"{POOL}-{port}"} for port in ("http", "grpc")
    ]
    service = pool.get("service", POOL)
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"
    wait_for_cluster(
        "the model rendered onto the volume",
        lambda: _with_condition(pool, "inferencemodel", MODEL, "Rendered"), 180, describe=pool.describe,
    )  # fmt: skip

    rng = np.random.default_rng(0)
    a, b = rng.random((1, 16), dtype=np.float32), rng.random((1, 16), dtype=np.float32)
    rows = []

    # ---- HTTP: the first request after idling
    wait_for_cluster("the idle pool at zero pods", lambda: _at_zero(pool), IDLE_SECONDS + 240, describe=pool.describe)
    wakes = [_idle_for_prometheus(pool)]
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a.ravel().tolist()},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": b.ravel().tolist()},
        ]
    }
    sent, t0 = time.time(), time.monotonic()
    r = httpx.post(
        f"{http_addon.interceptor_url}/v2/models/{MODEL}/infer",
        json=body,
        headers={"Host": pool.host, **AUTH},
        timeout=FIRST_ANSWER_LIMIT,
    )
    http_seconds = time.monotonic() - t0
    answered = time.time()
    assert r.status_code == 200, f"{r.status_code} {r.text}\n{pool.describe()}"
    out = {o["name"]: np.array(o["data"], dtype=np.float32) for o in r.json()["outputs"]}
    np.testing.assert_allclose(out["OUTPUT0"], (a + b).ravel(), rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT1"], (a - b).ravel(), rtol=1e-6)
    # the interceptor says the request waited for a cold start (its X-KEDA-HTTP-Cold-Start header)
    assert r.headers.get("x-keda-http-cold-start") == "true", dict(r.headers)
    rows.append(("HTTP", http_seconds, sent, answered, _woken_pod(pool)))
    wakes.append(_counted(pool, wakes[-1]))

    # ---- gRPC: idle again, then tritonclient over HTTP/2 through the same interceptor (its :authority is the host)
    wait_for_cluster("the pool back at zero pods", lambda: _at_zero(pool), IDLE_SECONDS + 240, describe=pool.describe)
    wakes.append(_idle_for_prometheus(pool))
    client = grpcclient.InferenceServerClient(
        http_addon.interceptor_url.removeprefix("http://"), channel_args=[("grpc.default_authority", pool.host)]
    )
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    sent, t0 = time.time(), time.monotonic()
    result = client.infer(
        MODEL, inputs, client_timeout=FIRST_ANSWER_LIMIT, headers={"authorization": f"Bearer {TOKEN}"}
    )
    grpc_seconds = time.monotonic() - t0
    answered = time.time()
    client.close()
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    rows.append(("gRPC", grpc_seconds, sent, answered, _woken_pod(pool)))
    wakes.append(_counted(pool, wakes[-1]))

    # wake: request → the pod object (KEDA's reaction to the scaler's push, the operator's Deployment; the pod's
    # creation time has whole seconds); start: pod created → models Ready (status.pods); answer: → the reply
    # (readiness probe, EndpointSlice, the interceptor's proxying)
    lines = [f"scale from zero through KEDA's HTTP add-on {http_addon.version} (idle {IDLE_SECONDS}s → 0 pods):",
             f"{'protocol':<8} {'first answer s':>14} {'wake':>5} {'start':>6} {'answer':>6}  "
             "pod start phases (s after the one before)"]  # fmt: skip
    for proto, secs, sent_at, answered_at, pod in rows:
        wake = _epoch(pod["created"]) - sent_at
        start = _epoch(pod["modelsReady"]) - _epoch(pod["created"])
        tail = answered_at - _epoch(pod["modelsReady"])
        detail = ", ".join(f"{k} {pod['seconds'][k]:.1f}" for k in PHASES)
        lines.append(f"{proto:<8} {secs:>14.1f} {wake:>5.1f} {start:>6.1f} {tail:>6.1f}  {detail}")
    lines.append(f"dashboard's wakes from zero (at zero, woken; HTTP then gRPC): {wakes}")
    print("\n" + "\n".join(lines))
    assert http_seconds < FIRST_ANSWER_LIMIT and grpc_seconds < FIRST_ANSWER_LIMIT
    # each wake counted once, and nothing while the pool idled at zero between them
    assert wakes[1:] == [wakes[0] + 1, wakes[0] + 1, wakes[0] + 2], wakes
    # through the shared interceptor, a caller without the pool's token is refused by the pool itself
    refused = httpx.post(
        f"{http_addon.interceptor_url}/v2/models/{MODEL}/infer", json=body, headers={"Host": pool.host}, timeout=60
    )
    assert refused.status_code == 401, refused.text


def test_a_host_name_another_pool_holds_is_a_condition_not_a_second_route(pool: Pool, images: dict) -> None:
    """Issue #37 item 4: a second pool asking for the first pool's host gets ScaleToZero False (HostConflict)
    and a route without that name; a name of another namespace's Service is refused (HostRefused)."""
    wait_for_cluster(
        "the first pool's routes", lambda: _with_condition(pool, "inferenceserver", POOL, "ScaleToZero"), 180,
        describe=pool.describe,
    )  # fmt: skip
    grab = pool_server(
        "grabber", images,
        auth={"tokenSecret": {"name": "pool-token"}},
        autoscaling={
            "minReplicas": 0, "maxReplicas": 1, "target": {"metric": "PendingRequests", "value": "10"},
            "scaleToZero": {"idleSeconds": IDLE_SECONDS, "hosts": [pool.host, "resnet.team-a"]},
        },
    )  # fmt: skip
    pool.apply(grab)

    def refused() -> dict[str, Any] | None:
        cond = _condition(pool.get("inferenceserver", "grabber"), "ScaleToZero")
        return cond if cond.get("reason") == "HostConflict" else None

    try:
        cond = wait_for_cluster("ScaleToZero HostConflict on the second pool", refused, 120, describe=pool.describe)
        # both of the first pool's routes hold the name; the message names one of them
        assert f"host '{pool.host}' is already routed by InterceptorRoute {pool.ns}/{POOL}-" in cond["message"]
        assert "'resnet.team-a' is a Service name of namespace 'team-a'" in cond["message"]
        route = pool.get("interceptorroute", "grabber-http")
        hosts = route["spec"]["rules"][0]["hosts"]
        assert pool.host not in hosts and "resnet.team-a" not in hosts and f"grabber.{pool.ns}" in hosts
        # the first pool keeps its name
        assert pool.host in pool.get("interceptorroute", f"{POOL}-http")["spec"]["rules"][0]["hosts"]
    finally:
        pool.kubectl("delete", "inferenceserver", "grabber", "--wait=false", check=False)


def test_scale_to_zero_needs_a_token_and_no_tls(pool: Pool) -> None:
    """The API server refuses minReplicas 0 without auth.tokenSecret, and with auth.tls (issue #37 item 5)."""
    base = {"image": "kubeinfer-server:test", "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}
    for name, auth, message in [
        ("no-token", None, "autoscaling.minReplicas 0 needs auth.tokenSecret"),
        ("tls", {"tokenSecret": {"name": "t"}, "tls": {"certificateSecret": "c"}}, "cannot be used with auth.tls"),
    ]:
        spec = {**base, **({"auth": auth} if auth else {})}
        bad = {"apiVersion": API, "kind": "InferenceServer", "metadata": {"name": name}, "spec": spec}
        proc = pool.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_scale_to_zero_objects_go_with_min_replicas_back_at_one(pool: Pool) -> None:
    """minReplicas back to 1: the operator deletes its InterceptorRoutes, the ScaledObject loses the push
    triggers, and ScaleToZero is no longer reported."""
    pool.kubectl("patch", "inferenceserver", POOL, "--type=json", "-p", json.dumps([
        {"op": "remove", "path": "/spec/autoscaling/scaleToZero"},
        {"op": "replace", "path": "/spec/autoscaling/minReplicas", "value": 1},
    ]))  # fmt: skip

    def cleaned() -> bool:
        routes = json.loads(pool.kubectl("get", "interceptorroutes", "-o", "json").stdout)["items"]
        so = pool.get("scaledobject", POOL)
        isrv = pool.get("inferenceserver", POOL)
        return (
            not routes
            and so.get("spec", {}).get("minReplicaCount") == 1
            and [t["type"] for t in so["spec"]["triggers"]] == ["prometheus"]
            and not _condition(isrv, "ScaleToZero")
        )

    wait_for_cluster("the routes gone and the ScaledObject at min 1", cleaned, 120, describe=pool.describe)


def test_min_replicas_zero_with_an_hpa_is_refused_by_the_api_server(pool: Pool) -> None:
    bad = {
        "apiVersion": API,
        "kind": "InferenceServer",
        "metadata": {"name": "hpa-zero"},
        "spec": {
            "image": "kubeinfer-server:test",
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "autoscaler": "HPA"},
        },
    }
    proc = pool.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0 and "an HPA never scales to zero" in proc.stderr, proc.stderr
