"""The InferenceServer status as typed classes: each field's JSON name and description in one place.
``server_crd`` generates the CRD's status schema from them (``typed.schema_of``); the server controller fills
``InferenceServerStatus`` and writes it with ``typed.as_body(..., nulls=True)`` (a merge patch: an unset field
removes what an earlier status said).

The conditions' schema is the one both CRDs share (``CONDITIONS``); a pod's start-up timeline is
``pod_start``'s document, its phases ``server_spec.POD_START_PHASES``, so its schema is built from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from . import CONDITIONS
from .server_spec import POD_START_PHASES
from .typed import resolve, spec_field

#: where a timestamp's format goes in the CRD (after its description)
_TIME_ORDER = ("type", "description", "format")

#: ``status.pods[]``: ``pod_start.pod_timeline``'s document
POD_START_SCHEMA: dict[str, Any] = {
    "type": "array",
    "description": "How each pod started: the time of each phase (created, scheduled, containerStarted, "
    "listening, modelsReady) and the seconds each took after the one before (operator/servers/pod_start.py).",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Pod name."},
            **{
                phase: {"type": "string", "description": f"When {meaning}.", "format": "date-time"}
                for phase, meaning in POD_START_PHASES
            },
            "seconds": {
                "type": "object",
                "description": "Seconds from the phase before to this one, by phase.",
                "additionalProperties": {"type": "number"},
            },
        },
    },
}


@dataclass(frozen=True, kw_only=True)
class ScaleToZeroStatus:
    routes: tuple[str, ...] = spec_field("routes", "The InterceptorRoutes (HTTP port, gRPC port).", default=())
    hosts: tuple[str, ...] = spec_field("hosts", "Host names the interceptor routes to the pool.", default=())
    idle_seconds: int | None = spec_field("idleSeconds", "Seconds idle before the pool scales to zero.", default=None)
    scaler_address: str | None = spec_field(
        "scalerAddress", "The add-on's external scaler that KEDA asks (operator setting).", default=None
    )


@dataclass(frozen=True, kw_only=True)
class AutoscalingStatus:
    autoscaler: Literal["KEDA", "HPA", "None"] = spec_field(
        "autoscaler", "KEDA, HPA, or None (see the AutoscalingReady condition)."
    )
    kind: str | None = spec_field(
        "kind", "Kind of the owned object: ScaledObject or HorizontalPodAutoscaler.", default=None
    )
    name: str | None = spec_field("name", "Name of the owned object (the InferenceServer's name).", default=None)
    hpa: str | None = spec_field("hpa", "The HPA that scales the pool (keda-hpa-<name> under KEDA).", default=None)
    query: str | None = spec_field("query", "The PromQL query KEDA evaluates.", default=None)
    threshold: str | None = spec_field("threshold", "The target the query's value is compared with.", default=None)
    current_replicas: int | None = spec_field("currentReplicas", "Replicas the HPA last observed.", default=None)
    desired_replicas: int | None = spec_field("desiredReplicas", "Replicas the HPA last asked for.", default=None)
    last_scale_time: str | None = spec_field(
        "lastScaleTime",
        "When the HPA last changed the replica count.",
        default=None,
        format="date-time",
        key_order=_TIME_ORDER,
    )
    current_metric_values: tuple[str, ...] | None = spec_field(
        "currentMetricValues", "Metric values the HPA last read, as quantities.", default=None
    )
    scaling_active: str | None = spec_field(
        "scalingActive", "Why the HPA cannot compute a scale, when it cannot.", default=None
    )
    scale_to_zero: ScaleToZeroStatus | None = spec_field(
        "scaleToZero", "minReplicas 0: how requests wake the pool (KEDA's HTTP add-on).", default=None
    )


@dataclass(frozen=True, kw_only=True)
class InferenceServerStatus:
    DESCRIPTION: ClassVar[str] = "Observed state of the server pool."

    observed_generation: int | None = spec_field(
        "observedGeneration", "metadata.generation last reconciled.", default=None, format="int64"
    )
    conditions: tuple[Mapping[str, Any], ...] = spec_field("conditions", schema=CONDITIONS, default=())
    replicas: int = spec_field("replicas", "Pods of the Deployment.", default=0)
    ready_replicas: int = spec_field("readyReplicas", "Ready pods of the Deployment.", default=0)
    selector: str | None = spec_field("selector", "Label selector of the pods (scale subresource).", default=None)
    models: tuple[str, ...] = spec_field("models", "InferenceModels that name this server.", default=())
    model_count: int = spec_field(
        "modelCount", "How many InferenceModels name this server (the Models column of kubectl get).", default=0
    )
    endpoint: str | None = spec_field("endpoint", "host:port of the HTTP endpoint (the Service).", default=None)
    repository_claim: str | None = spec_field(
        "repositoryClaim",
        "The PersistentVolumeClaim the pods mount (reaches only this namespace's folder).",
        default=None,
    )
    autoscaling: AutoscalingStatus | None = spec_field(
        "autoscaling", "The autoscaler the operator owns for this pool and what its HPA last saw.", default=None
    )
    pods: tuple[Mapping[str, Any], ...] | None = spec_field("pods", schema=POD_START_SCHEMA, default=None)


resolve(InferenceServerStatus)
