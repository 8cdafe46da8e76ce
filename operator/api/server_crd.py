"""The InferenceServer CRD: a pool of kubeinfer-server pods over one repository folder. Its spec schema is
generated from the typed classes (``server_types``), its status schema from ``server_status``'s."""

from __future__ import annotations

from typing import Any

from . import crd
from .server_status import InferenceServerStatus
from .server_types import InferenceServerSpec
from .typed import schema_of

#: generated from the typed classes, the one home of each field's name, description, bounds and default
INFERENCE_SERVER_SPEC = schema_of(InferenceServerSpec)
INFERENCE_SERVER_STATUS = schema_of(InferenceServerStatus)


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
