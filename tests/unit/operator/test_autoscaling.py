"""spec.autoscaling → KEDA ScaledObject or autoscaling/v2 HPA (pure rendering; the cluster path is in e2e/)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from kubeinfer.operator.api.server_types import Autoscaling, InferenceServerSpec
from kubeinfer.operator.api.typed import parse
from kubeinfer.operator.traffic import autoscaling

PROM = "http://prometheus.monitoring.svc:9090"
SEL = 'namespace="ml",serving_kubeinfer_io_server="gpu-pool"'


@pytest.fixture
def keda_body(server_body):
    server_body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3}
    return server_body


def _trigger(body):
    return autoscaling.scaled_object(body, PROM)["spec"]["triggers"][0]


def test_scaled_object_scales_the_inference_server(keda_body):
    keda_body["spec"]["autoscaling"]["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 10}}
    so = autoscaling.scaled_object(keda_body, PROM)
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    assert so["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"
    assert so["metadata"]["annotations"] == {"scaledobject.keda.sh/hpa-excluded-labels": "app.kubernetes.io/managed-by"}
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "serving.kubeinfer.io/v1alpha1",
        "kind": "InferenceServer",
        "name": "gpu-pool",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (1, 3, 15)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"] == {
        "name": "keda-hpa-gpu-pool",
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}},
    }


def test_default_signal_is_queue_time_per_request_as_a_pool_average(keda_body):
    t = _trigger(keda_body)
    assert t["type"] == "prometheus" and t["metricType"] == "Value"
    assert t["metadata"] == {
        "serverAddress": PROM,
        "query": f"sum(rate(nv_inference_queue_duration_us{{{SEL}}}[1m])) / "
        f"(sum(rate(nv_inference_request_success{{{SEL}}}[1m])) > 0) or vector(0)",
        "threshold": "5000",
        "ignoreNullValues": "true",
    }


def test_pending_requests_per_pod(keda_body):
    keda_body["spec"]["autoscaling"]["target"] = {"metric": "PendingRequests", "value": 4}
    t = _trigger(keda_body)
    assert t["metricType"] == "AverageValue"
    assert t["metadata"]["query"] == f"sum(nv_inference_pending_request_count{{{SEL}}}) or vector(0)"
    assert t["metadata"]["threshold"] == "4"


def test_cpu_utilisation_is_relative_to_the_request(keda_body):
    spec = keda_body["spec"]
    spec["autoscaling"]["target"] = {"metric": "CPU", "value": 80}
    spec["autoscaling"]["prometheus"] = {"window": "30s"}
    spec["resources"] = {"requests": {"cpu": "500m"}}
    t = _trigger(keda_body)
    assert t["metricType"] == "AverageValue"
    assert t["metadata"]["query"] == f"sum(rate(process_cpu_seconds_total{{{SEL}}}[30s])) or vector(0)"
    assert t["metadata"]["threshold"] == "0.4"  # 80% of half a core
    del spec["resources"]
    with pytest.raises(autoscaling.AutoscalingError) as err:
        _trigger(keda_body)
    assert err.value.reason == "NoCPURequest"


def test_gpu_and_custom_query(keda_body):
    auto = keda_body["spec"]["autoscaling"]
    auto["target"] = {"metric": "GPU", "value": "75"}
    t = _trigger(keda_body)
    assert (t["metricType"], t["metadata"]["threshold"]) == ("Value", "75")
    assert t["metadata"]["query"] == f"avg(nv_gpu_utilization{{{SEL}}}) * 100 or vector(0)"
    auto["prometheus"] = {"query": "sum(rate(nv_inference_count[1m]))", "metricType": "AverageValue"}
    auto["target"] = {"value": 50}
    t = _trigger(keda_body)
    assert (t["name"], t["metricType"], t["metadata"]["threshold"]) == ("custom-query", "AverageValue", "50")
    assert t["metadata"]["query"] == "sum(rate(nv_inference_count[1m]))"


@pytest.mark.parametrize(
    ("text", "value"), [(2, "2"), ("500m", "0.5"), ("1.5", "1.5"), ("2k", "2000"), ("1Ki", "1024")]
)
def test_quantities(text, value):
    assert autoscaling.quantity(text) == Decimal(value)


@pytest.mark.parametrize("bad", ["fast", "1x", "", "0", "-3"])
def test_bad_targets_are_refused(keda_body, bad):
    keda_body["spec"]["autoscaling"]["target"] = {"value": bad}
    with pytest.raises(autoscaling.AutoscalingError) as err:
        _trigger(keda_body)
    assert err.value.reason == "InvalidTarget"


def test_hpa_passes_metrics_through_and_targets_the_server(server_body):
    hpa = autoscaling.hpa(server_body)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "serving.kubeinfer.io/v1alpha1",
        "kind": "InferenceServer",
        "name": "gpu-pool",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 8)
    assert hpa["spec"]["metrics"] == server_body["spec"]["autoscaling"]["metrics"]


def test_hpa_signals_name_the_metrics_an_adapter_serves(server_body):
    auto = server_body["spec"]["autoscaling"]
    del auto["metrics"]
    default = autoscaling.hpa(server_body)["spec"]["metrics"][0]
    assert default["pods"] == {
        "metric": {"name": "nv_inference_queue_duration_us_per_request"},
        "target": {"type": "AverageValue", "averageValue": "5000"},
    }
    auto["target"] = {"metric": "PendingRequests", "value": 4}
    assert autoscaling.hpa(server_body)["spec"]["metrics"][0]["pods"] == {
        "metric": {"name": "nv_inference_pending_request_count"},
        "target": {"type": "AverageValue", "averageValue": "4"},
    }
    auto["target"] = {"metric": "CPU", "value": 70}
    cpu = autoscaling.hpa(server_body)["spec"]["metrics"][0]
    assert cpu["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    auto["target"] = {"metric": "GPU", "value": 60}
    gpu = autoscaling.hpa(server_body)["spec"]["metrics"][0]
    assert gpu["pods"]["target"]["averageValue"] == "0.6"


def test_hpa_observation_reads_replicas_and_metric_values():
    hpa = {
        "status": {
            "currentReplicas": 2,
            "desiredReplicas": 3,
            "lastScaleTime": "2026-12-01T08:00:00Z",
            "currentMetrics": [
                {"type": "External", "external": {"metric": {"name": "s0-prometheus"}, "current": {"value": "7123"}}},
                {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40}}},
            ],
            "conditions": [{"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric",
                            "message": "no metric"}],
        }
    }  # fmt: skip
    assert autoscaling.hpa_observation(hpa) == {
        "currentReplicas": 2,
        "desiredReplicas": 3,
        "lastScaleTime": "2026-12-01T08:00:00Z",
        "currentMetricValues": ["7123", "40"],
        "scalingActive": "FailedGetExternalMetric: no metric",
    }
    assert autoscaling.hpa_observation(None) == {}


class FakeDiscovery:
    """Only what ``Autoscaler.choose`` asks: is the ScaledObject resource served?"""

    def __init__(self, served: bool) -> None:
        self.served = served
        self.calls = 0

    def resource_served(self, group: str, version: str, plural: str) -> bool:
        self.calls += 1
        assert (group, version, plural) == ("keda.sh", "v1alpha1", "scaledobjects")
        return self.served


def _autoscaling(**fields):
    return parse(Autoscaling, {"maxReplicas": 2, **fields})


def test_choice_of_autoscaler():
    keda = autoscaling.Autoscaler(FakeDiscovery(True))
    assert keda.choose(_autoscaling()) == "KEDA"
    assert keda.choose(_autoscaling(autoscaler="HPA")) == "HPA"
    keda.choose(_autoscaling())
    assert keda.kube.calls == 1  # discovery is cached
    none = autoscaling.Autoscaler(FakeDiscovery(False))
    with pytest.raises(autoscaling.AutoscalingError) as err:
        none.choose(_autoscaling())
    assert err.value.reason == "NoMetricsAdapter" and "autoscaler: HPA" in err.value.message
    with pytest.raises(autoscaling.AutoscalingError) as err:
        none.choose(_autoscaling(autoscaler="KEDA"))
    assert err.value.reason == "KEDANotInstalled"
    assert none.choose(_autoscaling(autoscaler="HPA")) == "HPA"


# ---- scale to zero: KEDA's HTTP add-on ------------------------------------------------------------------
SCALER = "keda-add-ons-http-external-scaler.keda:9090"


@pytest.fixture
def zero_body(server_body):
    server_body["spec"]["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": 3,
        "scaleToZero": {"idleSeconds": 30, "hosts": ["pool.example.com"]},
    }
    server_body["spec"]["auth"] = {"tokenSecret": {"name": "pool-token"}}  # a pool at zero must have one
    return server_body


def test_min_zero_adds_one_push_trigger_per_route_and_the_idle_period(zero_body):
    so = autoscaling.scaled_object(zero_body, PROM, SCALER)
    spec = so["spec"]
    assert (spec["minReplicaCount"], spec["cooldownPeriod"]) == (0, 30)
    prom, http, grpc = spec["triggers"]
    assert prom["type"] == "prometheus"  # the signal still scales 1..max
    assert http == {
        "type": "external-push",
        "name": "http-requests",
        "metadata": {"scalerAddress": SCALER, "interceptorRoute": "gpu-pool-http"},
    }
    assert grpc["metadata"] == {"scalerAddress": SCALER, "interceptorRoute": "gpu-pool-grpc"}
    with pytest.raises(autoscaling.AutoscalingError):
        autoscaling.scaled_object(zero_body, PROM)  # no scaler: refused, not a ScaledObject that never wakes


def test_min_one_renders_no_http_trigger(keda_body):
    spec = autoscaling.scaled_object(keda_body, PROM, SCALER)["spec"]
    assert [t["type"] for t in spec["triggers"]] == ["prometheus"] and "cooldownPeriod" not in spec


def test_interceptor_routes_reach_the_http_and_grpc_ports(zero_body):
    http, grpc = autoscaling.interceptor_routes(zero_body)
    hosts = ["pool.example.com", "gpu-pool.ml", "gpu-pool.ml.svc", "gpu-pool.ml.svc.cluster.local"]
    assert http["apiVersion"] == "http.keda.sh/v1beta1" and http["kind"] == "InterceptorRoute"
    assert http["metadata"]["name"] == "gpu-pool-http" and http["metadata"]["namespace"] == "ml"
    assert http["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"
    assert http["spec"] == {
        "target": {"service": "gpu-pool", "portName": "http"},
        "rules": [{"hosts": hosts}],
        "scalingMetric": {"concurrency": {"targetValue": 100}},
    }
    # gRPC shares the hosts; its path prefix is longer than the HTTP route's (none), so it wins for gRPC calls
    assert grpc["metadata"]["name"] == "gpu-pool-grpc"
    assert grpc["spec"]["target"] == {"service": "gpu-pool", "portName": "grpc"}
    assert grpc["spec"]["rules"] == [{"hosts": hosts, "paths": [{"value": "/inference.GRPCInferenceService/"}]}]


def test_the_grpc_port_speaks_h2c(server_body):
    from kubeinfer.operator.servers import manifests

    ports = {p["name"]: p for p in manifests.service(server_body)["spec"]["ports"]}
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"  # the interceptor picks HTTP/2 by it
    assert "appProtocol" not in ports["http"]


class Discovery:
    """A cluster that serves ``served`` (KEDA, its HTTP add-on) and holds no object of ours yet."""

    def __init__(self, *served: str) -> None:
        self.served = set(served)

    def resource_served(self, group: str, version: str, plural: str) -> bool:
        return f"{plural}.{group}" in self.served

    def hpa_owned_by(self, namespace: str, name: str, uid: str) -> bool:
        return False

    def get_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> None:
        return None


def test_min_zero_without_the_add_on_is_refused_with_both_conditions(zero_body):
    zero_body["metadata"]["uid"] = "1234-uid"
    scaler = autoscaling.Autoscaler(Discovery("scaledobjects.keda.sh"), PROM)
    conds, report = scaler.reconcile(zero_body)
    assert report == {"autoscaler": "None"}
    assert [(c.type, c.status, c.reason) for c in conds] == [
        ("AutoscalingReady", False, "HTTPAddonNotInstalled"),
        ("ScaleToZero", False, "HTTPAddonNotInstalled"),
    ]
    assert "InterceptorRoutes" in conds[0].message


@pytest.mark.parametrize(
    ("auth", "reason"),
    [
        (None, "ScaleToZeroNeedsToken"),
        ({"tokenSecret": {"name": "t"}, "tls": {"certificateSecret": "c"}}, "ScaleToZeroNeedsPlainText"),
        ({"tokenSecret": {"name": "t"}}, None),
    ],
)
def test_scale_to_zero_needs_a_token_and_plain_text(zero_body, auth, reason):
    """Issue #37 item 5, for objects an older CRD admitted (the CRD's CEL rules refuse them first)."""
    zero_body["spec"].pop("auth")
    if auth is not None:
        zero_body["spec"]["auth"] = auth
    refusal = autoscaling.scale_to_zero_refusal(InferenceServerSpec.from_body(zero_body))
    assert (refusal.reason if refusal else None) == reason
    if reason:
        conditions, report = autoscaling.Autoscaler(Discovery("scaledobjects.keda.sh")).reconcile(zero_body)
        assert [(c.type, c.status, c.reason) for c in conditions] == [
            ("AutoscalingReady", False, reason),
            ("ScaleToZero", False, reason),
        ]
