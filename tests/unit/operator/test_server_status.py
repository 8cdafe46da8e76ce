"""The typed InferenceServer status (``operator/api/server_status.py``): what the controller reports (the
autoscaler's report, the pods' start-up timelines, the conditions) passes through the classes unchanged, an
unset field is written as null (the merge patch removes what an earlier status said), and the CRD's status
schema is the one generated from the classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubeinfer.operator.api import status
from kubeinfer.operator.api.server_status import AutoscalingStatus, InferenceServerStatus
from kubeinfer.operator.api.typed import as_body, parse, schema_of
from kubeinfer.operator.servers.pod_start import pod_timeline
from kubeinfer.operator.traffic import autoscaling

ROOT = Path(__file__).resolve().parents[3]
PROM = "http://prometheus.monitoring.svc:9090"
READY = {"status": {"conditions": [{"type": "Ready", "status": "True", "message": ""}]}}


class Cluster:
    """The operator's Kube as the autoscaler uses it, for a cluster with KEDA and its HTTP add-on whose objects
    are all Ready, and an HPA that has scaled once."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def resource_served(self, group: str, version: str, plural: str) -> bool:
        return True

    def hpa_owned_by(self, namespace: str, name: str, uid: str) -> bool:
        return False

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return obj

    def list_custom(self, group: str, version: str, plural: str, namespace: str | None) -> list[Any]:
        return []

    def get_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return READY

    def read_hpa(self, namespace: str, name: str) -> dict[str, Any]:
        return {
            "status": {
                "currentReplicas": 1,
                "desiredReplicas": 2,
                "lastScaleTime": "2026-12-02T13:00:00Z",
                "currentMetrics": [{"type": "External", "external": {"current": {"averageValue": "12"}}}],
                "conditions": [{"type": "ScalingActive", "status": "False", "reason": "R", "message": "m"}],
            }
        }


def _report(server_body: dict[str, Any]) -> dict[str, Any]:
    """The autoscaler's report for a pool that scales to zero (every field it can say)."""
    server_body["spec"]["auth"] = {"tokenSecret": {"name": "t"}}
    server_body["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 3, "scaleToZero": {"hosts": ["p.x"]}}
    conds, report = autoscaling.Autoscaler(Cluster(), PROM).reconcile(server_body)
    assert report is not None and report["autoscaler"] == "KEDA" and "scaleToZero" in report, conds
    return report


def test_the_autoscalers_report_passes_through_the_classes_unchanged(server_body):
    """Parsing drops keys the classes do not know: every key the autoscaler reports must be one of them."""
    report = _report(server_body)
    assert {"currentMetricValues", "scalingActive", "lastScaleTime", "query"} <= set(report)
    assert as_body(parse(AutoscalingStatus, report)) == report


def test_a_status_is_written_whole_with_nulls_for_what_it_no_longer_says(server_body):
    pod = {
        "metadata": {"name": "pool-abc", "creationTimestamp": "2026-12-02T13:00:00Z"},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-02T13:00:01Z"}]
        },
    }
    conditions = status.conditions([status.Condition("Ready", True, "Serving", "")], None, 3)
    full = InferenceServerStatus(
        observed_generation=3,
        conditions=tuple(conditions),
        replicas=2,
        ready_replicas=1,
        selector="app=x",
        models=("a", "b"),
        model_count=2,
        endpoint="pool.ns.svc:8000",
        repository_claim="kubeinfer-repository",
        autoscaling=parse(AutoscalingStatus, _report(server_body)),
        pods=(pod_timeline(pod, None),),
    )
    body = as_body(full, nulls=True)
    assert as_body(parse(InferenceServerStatus, body), nulls=True) == body
    assert body["models"] == ["a", "b"] and body["conditions"] == conditions
    assert body["pods"][0]["name"] == "pool-abc" and "scheduled" in body["pods"][0]
    # no claim, no autoscaler, no pods: each key is there, as null, so the merge patch clears it
    bare = as_body(InferenceServerStatus(observed_generation=4, endpoint="pool.ns.svc:8000"), nulls=True)
    assert {k: bare[k] for k in ("repositoryClaim", "autoscaling", "pods")} == dict.fromkeys(
        ("repositoryClaim", "autoscaling", "pods")
    )
    assert "autoscaling" not in as_body(InferenceServerStatus())


def test_the_written_body_is_plain_json_in_the_fields_order():
    """``as_body`` writes from writers built once per class: tuples become lists, mappings fresh dicts, a nested
    object leaves its unset fields out even where the top level writes them as null; keys in field order."""
    condition = {"type": "Ready", "status": "True"}
    scale = AutoscalingStatus(autoscaler="KEDA", current_metric_values=("3",))
    body = as_body(InferenceServerStatus(conditions=(condition,), models=("a",), autoscaling=scale), nulls=True)
    assert list(body) == [
        "observedGeneration",
        "conditions",
        "replicas",
        "readyReplicas",
        "selector",
        "models",
        "modelCount",
        "endpoint",
        "repositoryClaim",
        "autoscaling",
        "pods",
    ]
    assert body["conditions"] == [condition] and body["conditions"][0] is not condition
    assert body["models"] == ["a"] and body["observedGeneration"] is None and body["pods"] is None
    assert body["autoscaling"] == {"autoscaler": "KEDA", "currentMetricValues": ["3"]}
    assert as_body(scale) == body["autoscaling"]  # the same writers for a class written nested or alone


def test_the_published_status_schema_is_generated_from_the_classes():
    crd = yaml.safe_load((ROOT / "crds" / "serving.kubeinfer.io_inferenceservers.yaml").read_text())
    published = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert published == schema_of(InferenceServerStatus)
