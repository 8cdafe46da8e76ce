"""A platform team's rules for a shared pool, on a real server: ``--allowed-backends`` keeps model code off it,
and the plain metrics listener answers the health checks (what a kubelet probes when client certificates
are required on the HTTP port)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support.models import unary
from tests.support.repos import copy_python_models, write_model
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

RELU = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("pool") / "repo"
    write_model(repo, "relu", RELU, {1: unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4])})
    copy_python_models(repo, "multi_file")
    server = start_server(repo, "--allowed-backends=onnxruntime,tensorrt")
    yield server
    server.terminate()


def test_a_model_of_a_refused_backend_is_unavailable_with_the_reason(pool: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(pool.http_url)
    assert http.is_model_ready("relu")
    assert not http.is_model_ready("multi_file")
    index = {row["name"]: row for row in http.get_model_repository_index()}
    assert index["multi_file"]["state"] == "UNAVAILABLE"
    assert (
        "backend 'python' is not allowed on this server (--allowed-backends=onnxruntime,tensorrt)"
        in (index["multi_file"]["reason"])
    )
    with pytest.raises(InferenceServerException) as err:
        grpcclient.InferenceServerClient(pool.grpc_url).get_model_metadata("multi_file")
    assert "multi_file" in str(err.value)
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("relu", [inp]).as_numpy("OUT"), np.maximum(x, 0))


def test_the_metrics_listener_answers_the_health_checks(pool: ServerProcess) -> None:
    base = f"http://127.0.0.1:{pool.metrics_port}"
    assert httpx.get(f"{base}/v2/health/live", timeout=10).status_code == 200
    assert httpx.get(f"{base}/v2/health/ready", timeout=10).status_code == 200
    assert httpx.get(f"{base}/v2/models/relu", timeout=10).status_code == 404  # nothing else of the API


def test_the_health_checks_there_follow_readiness(tmp_path: Path) -> None:
    """Not ready while the strict readiness rule fails (a model that cannot load), like the HTTP port."""
    repo = tmp_path / "repo"
    copy_python_models(repo, "multi_file")
    server = start_server(repo, "--allowed-backends=onnxruntime", "--strict-readiness=true", wait=False)
    try:

        def load_failed() -> bool:
            try:
                rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=2).json()
            except httpx.HTTPError:
                return False
            return any(r.get("state") == "UNAVAILABLE" for r in rows)

        wait_for("the refused model's load to end", load_failed, 60, 0.2)
        metrics = f"http://127.0.0.1:{server.metrics_port}"
        assert httpx.get(f"{metrics}/v2/health/ready", timeout=5).status_code == 503
        assert httpx.get(f"{server.base_url}/v2/health/ready", timeout=5).status_code == 503
        assert httpx.get(f"{metrics}/v2/health/live", timeout=5).status_code == 200
    finally:
        server.terminate()
