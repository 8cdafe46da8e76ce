"""CUDA shared memory with tritonclient's own helpers (cudaIpc handles), over HTTP and gRPC.

Runs on a GPU machine (tests/gpu/run.sh); elsewhere it skips with the reason (tests/gpu/conftest.py).
On CPU machines tests/integration/test_shared_memory.py checks that registration answers Triton's
"GPUs not supported".
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.gpu.conftest import require
from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

ADD = """
name: "add"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def cudashm() -> Any:
    require(importlib.util.find_spec("cuda") is not None, "cuda-python is not installed: pip install kubeinfer[gpu]")
    import tritonclient.utils.cuda_shared_memory as cudashm

    return cudashm


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, cudashm: Any) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("cudashm") / "repo"
    write_model(repo, "add", ADD, {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])})
    server = start_server(repo, "--allow-client-shm=true")
    yield server
    server.terminate()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_round_trip(server: ServerProcess, cudashm: Any, protocol: str) -> None:
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    meta = client.get_server_metadata()
    assert "cuda_shared_memory" in (meta["extensions"] if protocol == "http" else list(meta.extensions))
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.float32)
    inp = cudashm.create_shared_memory_region(f"in_{protocol}", a.nbytes + b.nbytes, 0)
    out = cudashm.create_shared_memory_region(f"out_{protocol}", a.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(inp, [a, b])
        client.register_cuda_shared_memory(f"in_{protocol}", cudashm.get_raw_handle(inp), 0, a.nbytes + b.nbytes)
        client.register_cuda_shared_memory(f"out_{protocol}", cudashm.get_raw_handle(out), 0, a.nbytes)
        inputs = [mod.InferInput("A", [2, 4], "FP32"), mod.InferInput("B", [2, 4], "FP32")]
        inputs[0].set_shared_memory(f"in_{protocol}", a.nbytes)
        inputs[1].set_shared_memory(f"in_{protocol}", b.nbytes, offset=a.nbytes)
        output = mod.InferRequestedOutput("OUT")
        output.set_shared_memory(f"out_{protocol}", a.nbytes)
        client.infer("add", inputs, outputs=[output])
        got = cudashm.get_contents_as_numpy(out, np.float32, [2, 4])
        np.testing.assert_array_equal(got, a + b)
        # bounds are checked against the registered size
        bad = [mod.InferInput("A", [2, 4], "FP32"), mod.InferInput("B", [2, 4], "FP32")]
        bad[0].set_shared_memory(f"in_{protocol}", a.nbytes, offset=a.nbytes + 8)
        bad[1].set_data_from_numpy(b)
        with pytest.raises(InferenceServerException, match="Invalid offset \\+ byte size"):
            client.infer("add", bad)
        # a region larger than the allocation is refused at registration
        with pytest.raises(InferenceServerException, match="invalid args"):
            client.register_cuda_shared_memory(f"big_{protocol}", cudashm.get_raw_handle(out), 0, 1 << 30)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(inp)
        cudashm.destroy_shared_memory_region(out)


def test_cuda_status_and_unregister(server: ServerProcess, cudashm: Any, tmp_path: Path) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    region = cudashm.create_shared_memory_region("status_region", 64, 0)
    try:
        client.register_cuda_shared_memory("status_region", cudashm.get_raw_handle(region), 0, 64)
        assert client.get_cuda_shared_memory_status("status_region") == [
            {"name": "status_region", "device_id": 0, "byte_size": 64}
        ]
        client.unregister_cuda_shared_memory("status_region")
        assert client.get_cuda_shared_memory_status() == []
    finally:
        cudashm.destroy_shared_memory_region(region)
