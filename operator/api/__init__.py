"""The ``serving.kubeinfer.io`` API group, the operator's bottom wing: its names and the envelope both CRDs
share here; the CRDs (``model_crd``, ``server_crd``, written by ``crds``), generated from the typed spec and
status classes (``model_types``, ``model_status``, ``server_types``, ``server_status``, over ``typed``), the
facts and defaults they state (``model_spec``, ``server_spec``, ``pool_defaults``, ``schema``, ``descriptions``)
and the status documents (``status``) in the modules beside it. Imports nothing of the operator's other wings."""

from __future__ import annotations

from typing import Any

GROUP = "serving.kubeinfer.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

CONDITIONS = {
    "type": "array",
    "description": "Latest observations of the object's state (Kubernetes condition convention).",
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "items": {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Condition type, CamelCase (e.g. Ready)."},
            "status": {
                "type": "string",
                "enum": ["True", "False", "Unknown"],
                "description": "True, False or Unknown.",
            },
            "reason": {"type": "string", "description": "CamelCase reason for the last transition."},
            "message": {"type": "string", "description": "What happened and, for failures, what to fix."},
            "lastTransitionTime": {
                "type": "string",
                "format": "date-time",
                "description": "When status last changed.",
            },
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "metadata.generation the condition was computed for.",
            },
        },
    },
}


def crd(
    kind: str,
    plural: str,
    short: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    columns: list[dict[str, Any]],
    subresources: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["kubeinfer"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": f"{kind}: see `kubectl explain {kind.lower()}.spec`.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version of the object."},
                                "kind": {"type": "string", "description": "Kind of the object."},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }
