"""Shared InferenceModel / InferenceServer bodies for the operator's unit tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest

MODEL_SPEC: dict[str, Any] = {
    "server": "gpu-pool",
    "platform": "onnxruntime_onnx",
    "maxBatchSize": 64,
    "inputs": [{"name": "input", "dataType": "FP32", "dims": [3, 32, 32]}],
    "outputs": [{"name": "output", "dataType": "FP32", "dims": [10]}],
    "dynamicBatching": {"preferredBatchSize": [16, 32], "maxQueueDelayMicroseconds": 2000},
    "instanceGroups": [{"count": 2, "kind": "KIND_GPU"}],
    "versionPolicy": {"latest": {"numVersions": 1}},
    "versions": [
        {"version": 1, "source": {"uri": "https://models.example.com/resnet/1/model.onnx", "sha256": "a" * 64}},
        {"version": 2, "source": {"path": "uploads/resnet-v2.onnx"}},
    ],
}

SERVER_BODY: dict[str, Any] = {
    "apiVersion": "serving.kubeinfer.io/v1alpha1",
    "kind": "InferenceServer",
    "metadata": {"name": "gpu-pool", "namespace": "ml", "uid": "1234-uid", "generation": 1},
    "spec": {
        "replicas": 1,
        "image": "registry.example.com/kubeinfer-server:0.1.0",
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "repository": {"claimName": "kubeinfer-models", "subPath": "gpu-pool"},
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 8,
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
    },
}


@pytest.fixture
def model_spec() -> dict[str, Any]:
    return copy.deepcopy(MODEL_SPEC)


@pytest.fixture
def server_body() -> dict[str, Any]:
    return copy.deepcopy(SERVER_BODY)
