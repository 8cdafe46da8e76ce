"""Shared InferenceModel / InferenceServer bodies for the operator's unit tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.specs import server_spec

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
    "spec": server_spec(),
}


@pytest.fixture
def model_spec() -> dict[str, Any]:
    return copy.deepcopy(MODEL_SPEC)


@pytest.fixture
def server_body() -> dict[str, Any]:
    return copy.deepcopy(SERVER_BODY)
