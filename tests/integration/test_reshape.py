"""Config ``reshape`` for every backend, over HTTP and gRPC with tritonclient (Triton docs, "Reshape").

Clients send and get ``dims`` (the metadata says so, with -1 for the batch); the model takes and produces
``reshape.shape``; the server reshapes between them per batch item, as Triton core does, whatever the
backend: an ONNX model and Python models (plain and decoupled) here. A config whose dims and reshape hold
different numbers of elements is refused in Triton's words.
"""

from __future__ import annotations

import queue
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

ONNX = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 {input} }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 {output} }} ]
"""
RESHAPED = "dims: [ 2, 2 ] reshape: { shape: [ 4 ] }"
PLAIN = "dims: [ 4 ]"

PYTHON_CONFIG = """
backend: "python"
max_batch_size: 8
{decoupled}
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
output [
  { name: "FLAT" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } },
  { name: "RANK" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
#: FLAT: the input, flattened per row (the model's [N, 4]); RANK: how many dims the input reached it with
PYTHON_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            flat = x.reshape(len(x), -1)
            rank = np.full((len(x), 1), x.ndim, dtype=np.int32)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("FLAT", flat), pb_utils.Tensor("RANK", rank)])
            if self.decoupled:
                sender = request.get_response_sender()
                sender.send(response)
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(response)
        return None if self.decoupled else responses
"""


def python_model(repo: Path, name: str, decoupled: bool) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    (folder / "config.pbtxt").write_text(PYTHON_CONFIG.replace("{decoupled}", policy))
    (folder / "1" / "model.py").write_text(textwrap.dedent(PYTHON_MODEL))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("reshape")
    repo = root / "repo"
    relu = unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4])
    write_model(repo, "out_reshape", ONNX.format(input=PLAIN, output=RESHAPED), {1: relu})
    write_model(repo, "in_reshape", ONNX.format(input=RESHAPED, output=PLAIN), {1: relu})
    write_model(
        repo, "impossible", ONNX.format(input=PLAIN, output="dims: [ 2, 2 ] reshape: { shape: [ 5 ] }"), {1: relu}
    )
    python_model(repo, "py_reshape", decoupled=False)
    python_model(repo, "py_reshape_stream", decoupled=True)
    server = start_server(repo, log_dir=root)
    yield server
    server.terminate()


def x_rows(rows: int, shape: tuple[int, ...]) -> np.ndarray:
    return (np.arange(rows * 4, dtype=np.float32) - 5).reshape(rows, *shape)


def infer(server: ServerProcess, protocol: str, model: str, x: np.ndarray, outputs: list[str]) -> dict[str, Any]:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        inp = module.InferInput("IN", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer(model, [inp])
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_reshape_answers_in_dims(server: ServerProcess, protocol: str) -> None:
    x = x_rows(3, (4,))
    out = infer(server, protocol, "out_reshape", x, ["OUT"])["OUT"]
    assert out.shape == (3, 2, 2)
    np.testing.assert_array_equal(out, np.maximum(x, 0).reshape(3, 2, 2))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_input_reshape_takes_dims(server: ServerProcess, protocol: str) -> None:
    x = x_rows(3, (2, 2))
    out = infer(server, protocol, "in_reshape", x, ["OUT"])["OUT"]
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, np.maximum(x, 0).reshape(3, 4))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_python_model_gets_and_gives_reshape_shape_and_clients_dims(server: ServerProcess, protocol: str) -> None:
    x = x_rows(2, (2, 2))
    got = infer(server, protocol, "py_reshape", x, ["FLAT", "RANK"])
    assert got["RANK"].tolist() == [[2], [2]]  # the model saw [N, 4]: reshape.shape behind the batch
    assert got["FLAT"].shape == (2, 2, 2)  # it returned [N, 4]: the client gets dims
    np.testing.assert_array_equal(got["FLAT"], x)


def test_a_decoupled_python_models_responses_are_reshaped_too(server: ServerProcess) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        x = x_rows(1, (2, 2))
        inp = grpcclient.InferInput("IN", [1, 2, 2], "FP32")
        inp.set_data_from_numpy(x)
        client.async_stream_infer("py_reshape_stream", [inp])
        for _ in range(2):
            result = answers.get(timeout=60)
            assert not isinstance(result, Exception), result
            assert result.as_numpy("RANK").tolist() == [[2]]
            np.testing.assert_array_equal(result.as_numpy("FLAT"), x)
    finally:
        client.stop_stream()
        client.close()


def test_metadata_reports_dims_with_the_batch(server: ServerProcess) -> None:
    meta = httpx.get(f"{server.base_url}/v2/models/out_reshape", timeout=10).json()
    assert [(t["name"], t["shape"]) for t in meta["outputs"]] == [("OUT", [-1, 2, 2])]
    meta = httpx.get(f"{server.base_url}/v2/models/in_reshape", timeout=10).json()
    assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [("IN", [-1, 2, 2])]


def test_an_impossible_reshape_is_refused_in_tritons_words(server: ServerProcess) -> None:
    rows = {r["name"]: r for r in httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()}
    assert rows["impossible"]["state"] == "UNAVAILABLE"
    assert rows["impossible"]["reason"].startswith(
        "model output has different size for dims and reshape: output 'OUT' has dims [2, 2] and reshape [5]"
    )
