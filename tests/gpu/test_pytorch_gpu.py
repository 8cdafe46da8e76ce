"""PyTorch models on GPU instances, and TorchScript → ONNX → TensorRT with ``kubeinfer convert --tensorrt``."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.gpu.conftest import require
from tests.support.server import ServerProcess, start_server

CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 16
input [ {{ name: "INPUT__0" data_type: {dtype} dims: [ 3, 16, 16 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {dtype} dims: [ 10 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 2 kind: KIND_GPU gpus: [ 0 ] }} ]
{extra}
"""


@pytest.fixture(scope="module")
def torch_cuda() -> None:
    require(importlib.util.find_spec("torch") is not None, "torch is not installed: pip install kubeinfer[pytorch]")
    import torch

    require(torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device")


@pytest.fixture(scope="module")
def server(torch_cuda: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from tests.support import torch_models as tm

    repo = tmp_path_factory.mktemp("pytorch_gpu") / "repo"
    for name, dtype, half, extra in (
        ("fp32", "TYPE_FP32", False, ""),
        ("fp16", "TYPE_FP16", True, ""),
        ("cleaning", "TYPE_FP32", False, 'parameters { key: "ENABLE_CACHE_CLEANING" value { string_value: "true" } }'),
        ("shared", "TYPE_FP32", False, 'parameters { key: "ENABLE_WEIGHT_SHARING" value { string_value: "true" } }'),
    ):
        module = tm.classifier(3)
        tm.save_torchscript(module.half() if half else module, repo / name / "1" / "model.pt")
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name, dtype=dtype, extra=extra)))
    srv = start_server(repo, log_dir=repo.parent)
    yield srv
    srv.terminate()


@pytest.mark.parametrize("model", ["fp32", "cleaning", "shared"])
def test_gpu_instances_compute_what_the_cpu_module_computes(server: ServerProcess, model: str) -> None:
    from tests.support import torch_models as tm

    client = grpcclient.InferenceServerClient(server.grpc_url)
    images = np.random.default_rng(0).standard_normal((16, 3, 16, 16)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT__0", list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    got = client.infer(model, [inp]).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(got, tm.run(tm.classifier(3), images)[0], rtol=1e-3, atol=1e-3)


def test_fp16_model_on_the_gpu(server: ServerProcess) -> None:
    from tests.support import torch_models as tm

    client = grpcclient.InferenceServerClient(server.grpc_url)
    images = np.random.default_rng(1).standard_normal((4, 3, 16, 16)).astype(np.float16)
    inp = grpcclient.InferInput("INPUT__0", list(images.shape), "FP16")
    inp.set_data_from_numpy(images)
    got = client.infer("fp16", [inp]).as_numpy("OUTPUT__0")
    assert got.dtype == np.float16
    reference = tm.run(tm.classifier(3), images.astype(np.float32))[0]
    np.testing.assert_allclose(got.astype(np.float32), reference, rtol=2e-2, atol=2e-2)


def test_torchscript_to_tensorrt_fp16_is_served(torch_cuda: None, tensorrt_available: None, tmp_path: Path) -> None:
    from tests.support import torch_models as tm

    repo = tmp_path / "repo"
    source = repo / "resnet" / "1" / "model.pt"
    tm.save_torchscript(tm.resnet18_cifar(seed=0), source)
    (repo / "resnet" / "config.pbtxt").write_text(
        'name: "resnet"\nplatform: "pytorch_libtorch"\nmax_batch_size: 16\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "convert", str(source), "--repository", str(repo),
         "--name", "resnet_onnx", "--tensorrt", "--fp16"],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trt = [
        float(x)
        for x in re.findall(
            r"TensorRT output '[^']+': max abs difference [0-9.e+-]+, max rel difference ([0-9.e+-]+)", done.stdout
        )
    ]
    assert trt and max(trt) < 2e-2, done.stdout  # FP16 kernels
    assert (repo / "resnet_onnx_trt" / "1" / "model.plan").is_file()
    server = start_server(repo, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        images = np.random.default_rng(2).standard_normal((8, 3, 32, 32)).astype(np.float32)
        inp = grpcclient.InferInput("INPUT__0", list(images.shape), "FP32")
        inp.set_data_from_numpy(images)
        reference = client.infer("resnet", [inp]).as_numpy("OUTPUT__0")
        plan = client.infer("resnet_onnx_trt", [inp]).as_numpy("OUTPUT__0")
        assert np.abs(plan - reference).max() <= 2e-2 * np.abs(reference).max()
    finally:
        server.terminate()
