"""The InferenceModel CRD: the operator's spec fields (generated from ``model_types``' classes), the ModelConfig
fields (generated from the proto by ``schema``), and the status (from ``model_status``' classes)."""

from __future__ import annotations

import copy
from typing import Any

from kubeinfer.server.config import MODEL_CONFIG

from . import crd
from .model_spec import SOURCE_URI_PATTERN as SOURCE_URI_PATTERN
from .model_status import InferenceModelStatus
from .model_types import InferenceModelSpec
from .schema import CONFIG_TOP_FIELDS, message_schema
from .typed import schema_of

#: the operator's fields, generated from the typed classes (the one home of each field's facts)
_OPERATOR_SPEC = schema_of(InferenceModelSpec)


def inference_model_spec_schema() -> dict[str, Any]:
    """The spec schema: the typed classes' fields, with the ModelConfig's (generated from the proto) after
    ``server``."""
    config = message_schema(MODEL_CONFIG, CONFIG_TOP_FIELDS)["properties"]
    config["platform"]["maxLength"] = 64
    config["backend"]["maxLength"] = 64
    schema = copy.deepcopy(_OPERATOR_SPEC)
    first, *rest = schema["properties"].items()
    schema["properties"] = dict([first, *config.items(), *rest])
    return schema


#: generated from the typed classes, the one home of each status field's name and description
INFERENCE_MODEL_STATUS = schema_of(InferenceModelStatus)


def inference_model_crd() -> dict[str, Any]:
    # at a glance: is it serving, which versions, on how many replicas, and why not
    columns: list[dict[str, Any]] = [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Versions", "type": "string", "jsonPath": ".status.servingVersions"},
        {"name": "Replicas", "type": "string", "jsonPath": ".status.servingReplicas"},
        {"name": "Server", "type": "string", "jsonPath": ".spec.server"},
        {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Active Version", "type": "integer", "priority": 1, "jsonPath": ".status.activeVersion"},
        {
            "name": "Message",
            "type": "string",
            "priority": 1,
            "jsonPath": '.status.conditions[?(@.type=="Ready")].message',
        },
    ]
    return crd(
        "InferenceModel",
        "inferencemodels",
        "im",
        inference_model_spec_schema(),
        INFERENCE_MODEL_STATUS,
        columns,
        {"status": {}},
    )
