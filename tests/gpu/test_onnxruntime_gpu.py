"""ONNX Runtime on a GPU: the CUDA execution provider and the TensorRT execution provider (FP16,
engine cache on disk), on instances pinned to ``gpus: [0]``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from kubeinfer.server.examples import models

from tests.gpu.conftest import ort_providers, require
from tests.support.repos import write_model
from tests.support.server import start_server

BASE = """
    name: "{name}"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ 0 ] }} ]
    dynamic_batching {{ }}
"""
TRT_EP = """
    optimization { execution_accelerators { gpu_execution_accelerator [ {
      name: "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" }
    } ] } }
"""


def _reference(x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        models.resnet18_cifar(seed=0).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"input": x})[0]


def _serve_and_check(tmp_path: Path, name: str, config: str, rel_tol: float) -> Path:
    repo = tmp_path / "repo"
    model_dir = write_model(repo, name, textwrap.dedent(config), {1: models.resnet18_cifar(seed=0)})
    server = start_server(repo, log_dir=tmp_path)
    try:
        # the TensorRT EP builds its engine on load or on the first run
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=900)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows[name]["state"] == "READY", rows[name]
        x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(name, [inp]).as_numpy("output")
        expected = _reference(x)
        assert float(np.abs(got - expected).max()) < rel_tol * float(np.abs(expected).max())
        assert client.get_model_config(name)["instance_group"][0]["gpus"] == [0]
    finally:
        server.terminate()
    return model_dir


def test_cuda_execution_provider(tmp_path: Path) -> None:
    require("CUDAExecutionProvider" in ort_providers(), "onnxruntime-gpu with CUDA is not installed")
    _serve_and_check(tmp_path, "resnet_cuda", BASE.format(name="resnet_cuda"), 1e-3)


def test_tensorrt_execution_provider_fp16_with_engine_cache(tmp_path: Path) -> None:
    require(
        "TensorrtExecutionProvider" in ort_providers(),
        "onnxruntime-gpu has no TensorrtExecutionProvider (TensorRT libraries missing)",
    )
    model_dir = _serve_and_check(tmp_path, "resnet_trt_ep", BASE.format(name="resnet_trt_ep") + TRT_EP, 0.05)
    cache = model_dir / "1" / ".trt_cache"
    assert cache.is_dir() and any(cache.iterdir()), "the TensorRT EP wrote no engine cache"


@pytest.mark.parametrize("kind", ["KIND_GPU"])
def test_gpu_instance_on_a_missing_device_is_refused(tmp_path: Path, kind: str) -> None:
    from kubeinfer.server.runtime import devices

    repo = tmp_path / "repo"
    bad = devices.gpu_count()  # one past the last visible GPU
    write_model(
        repo,
        "far",
        f"""
        name: "far"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        instance_group [ {{ kind: {kind} gpus: [ {bad} ] }} ]
    """,
        {1: models.resnet18_cifar(seed=0)},
    )
    server = start_server(repo, log_dir=tmp_path)
    try:
        rows = {r["name"]: r for r in httpclient.InferenceServerClient(server.http_url).get_model_repository_index()}
        assert rows["far"]["state"] == "UNAVAILABLE"
        assert f"of model far specifies invalid or unsupported gpu id {bad}. GPUs with" in rows["far"]["reason"]
    finally:
        server.terminate()
