"""The InferenceServer CRD: a pool of kubeinfer-server pods over one repository folder. Its spec schema is
generated from the typed classes (``server_types``); its status schema is stated here."""

from __future__ import annotations

from typing import Any

from . import CONDITIONS, crd
from .server_spec import POD_START_PHASES
from .server_types import InferenceServerSpec
from .typed import schema_of


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _i(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "format": "int32", "description": description, **extra}


#: generated from the typed classes, the one home of each field's name, description, bounds and default
INFERENCE_SERVER_SPEC = schema_of(InferenceServerSpec)

INFERENCE_SERVER_STATUS = {
    "type": "object",
    "description": "Observed state of the server pool.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "description": "metadata.generation last reconciled.",
        },
        "conditions": CONDITIONS,
        "replicas": _i("Pods of the Deployment."),
        "readyReplicas": _i("Ready pods of the Deployment."),
        "selector": _s("Label selector of the pods (scale subresource)."),
        "models": {
            "type": "array",
            "description": "InferenceModels that name this server.",
            "items": {"type": "string"},
        },
        "modelCount": _i("How many InferenceModels name this server (the Models column of kubectl get)."),
        "endpoint": _s("host:port of the HTTP endpoint (the Service)."),
        "repositoryClaim": _s("The PersistentVolumeClaim the pods mount (reaches only this namespace's folder)."),
        "autoscaling": {
            "type": "object",
            "description": "The autoscaler the operator owns for this pool and what its HPA last saw.",
            "properties": {
                "autoscaler": _s(
                    "KEDA, HPA, or None (see the AutoscalingReady condition).", enum=["KEDA", "HPA", "None"]
                ),
                "kind": _s("Kind of the owned object: ScaledObject or HorizontalPodAutoscaler."),
                "name": _s("Name of the owned object (the InferenceServer's name)."),
                "hpa": _s("The HPA that scales the pool (keda-hpa-<name> under KEDA)."),
                "query": _s("The PromQL query KEDA evaluates."),
                "threshold": _s("The target the query's value is compared with."),
                "currentReplicas": _i("Replicas the HPA last observed."),
                "desiredReplicas": _i("Replicas the HPA last asked for."),
                "lastScaleTime": _s("When the HPA last changed the replica count.", format="date-time"),
                "currentMetricValues": {
                    "type": "array",
                    "description": "Metric values the HPA last read, as quantities.",
                    "items": {"type": "string"},
                },
                "scalingActive": _s("Why the HPA cannot compute a scale, when it cannot."),
                "scaleToZero": {
                    "type": "object",
                    "description": "minReplicas 0: how requests wake the pool (KEDA's HTTP add-on).",
                    "properties": {
                        "routes": {
                            "type": "array",
                            "description": "The InterceptorRoutes (HTTP port, gRPC port).",
                            "items": {"type": "string"},
                        },
                        "hosts": {
                            "type": "array",
                            "description": "Host names the interceptor routes to the pool.",
                            "items": {"type": "string"},
                        },
                        "idleSeconds": _i("Seconds idle before the pool scales to zero."),
                        "scalerAddress": _s("The add-on's external scaler that KEDA asks (operator setting)."),
                    },
                },
            },
        },
        "pods": {
            "type": "array",
            "description": "How each pod started: the time of each phase (created, scheduled, containerStarted, "
            "listening, modelsReady) and the seconds each took after the one before (operator/servers/pod_start.py).",
            "items": {
                "type": "object",
                "properties": {
                    "name": _s("Pod name."),
                    **{phase: _s(f"When {meaning}.", format="date-time") for phase, meaning in POD_START_PHASES},
                    "seconds": {
                        "type": "object",
                        "description": "Seconds from the phase before to this one, by phase.",
                        "additionalProperties": {"type": "number"},
                    },
                },
            },
        },
    },
}


def inference_server_crd() -> dict[str, Any]:
    # at a glance: how many replicas serve of how many wanted, what scales them, how many models, and why not
    # (the first False condition's reason: Ready=False always follows the condition that made it False)
    columns: list[dict[str, Any]] = [
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Available", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Available")].status'},
        {"name": "Autoscaler", "type": "string", "jsonPath": ".status.autoscaling.autoscaler"},
        {"name": "Models", "type": "integer", "jsonPath": ".status.modelCount"},
        {"name": "Problem", "type": "string", "jsonPath": '.status.conditions[?(@.status=="False")].reason'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Image", "type": "string", "priority": 1, "jsonPath": ".spec.image"},
    ]
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return crd(
        "InferenceServer",
        "inferenceservers",
        "isrv",
        INFERENCE_SERVER_SPEC,
        INFERENCE_SERVER_STATUS,
        columns,
        {"status": {}, "scale": scale},
    )
