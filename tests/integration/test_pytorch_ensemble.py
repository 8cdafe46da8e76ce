"""A PyTorch model as an ensemble step: the example CIFAR pipeline with its ONNX ResNet-18 swapped for the
TorchScript module carrying the same weights gives the same answers, and the step batches like any model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.repos import copy_example_repository
from tests.support.server import start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed: pip install kubeinfer[pytorch]"
)


def test_pipeline_with_a_torchscript_step_answers_as_the_onnx_one(tmp_path: Path) -> None:
    from tests.support import torch_models as tm

    repo = copy_example_repository(tmp_path / "repo")
    tm.save_torchscript(tm.resnet18_cifar(seed=0), repo / "resnet_torch" / "1" / "model.pt")  # the example's weights
    (repo / "resnet_torch" / "config.pbtxt").write_text(
        'name: "resnet_torch"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
        "dynamic_batching { }\n"
    )
    text = (repo / "cifar10_pipeline" / "config.pbtxt").read_text()
    text = text.replace('name: "cifar10_pipeline"', 'name: "torch_pipeline"').replace(
        '"cifar10_resnet"', '"resnet_torch"'
    )
    text = text.replace('key: "input" value: "preprocessed"', 'key: "INPUT__0" value: "preprocessed"')
    text = text.replace('key: "output" value: "logits"', 'key: "OUTPUT__0" value: "logits"')
    (repo / "torch_pipeline").mkdir()
    (repo / "torch_pipeline" / "1").mkdir()
    (repo / "torch_pipeline" / "config.pbtxt").write_text(text)
    server = start_server(repo, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        rng = np.random.default_rng(7)
        for _ in range(4):
            image = rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
            answers = []
            for model in ("cifar10_pipeline", "torch_pipeline"):
                inp = grpcclient.InferInput("IMAGE", list(image.shape), "UINT8")
                inp.set_data_from_numpy(image)
                answers.append(client.infer(model, [inp]).as_numpy("CLASS")[0, 0])
            assert answers[0] == answers[1]
        stats = httpx.get(f"{server.base_url}/v2/models/resnet_torch/stats", timeout=10).json()["model_stats"][0]
        assert stats["inference_count"] == 4  # every pipeline call went through the PyTorch model's scheduler
    finally:
        server.terminate()
