"""The sample InferenceServer spec (the one the issue and the README show), shared by unit and e2e tests."""

from __future__ import annotations

import copy
from typing import Any

_SERVER_SPEC: dict[str, Any] = {
    "replicas": 1,
    "image": "registry.example.com/kubeinfer-server:0.1.0",
    "resources": {"limits": {"nvidia.com/gpu": 1}},
    "repository": {"claimName": "kubeinfer-models", "subPath": "gpu-pool"},
    "autoscaling": {
        "minReplicas": 1,
        "maxReplicas": 8,
        "autoscaler": "HPA",
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "nv_inference_queue_duration_us_per_request"},
                    "target": {"type": "AverageValue", "averageValue": "5000"},
                },
            }
        ],
    },
}


def server_spec(**overrides: Any) -> dict[str, Any]:
    """A fresh copy of the sample ``gpu-pool`` spec, top-level keys replaced by ``overrides``."""
    return {**copy.deepcopy(_SERVER_SPEC), **overrides}
