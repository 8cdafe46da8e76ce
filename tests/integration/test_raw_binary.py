"""Raw binary requests (Inference-Header-Content-Length: 0): Triton's shape deduction and its errors."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, http_transports, start_server

RAW = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module", params=http_transports())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("raw") / "repo"
    # one FP32 input with one variable dim, batching: shape deduced as [1, n]
    write_model(
        repo,
        "neg",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
        {1: test_models.unary("neg", "Neg", TensorProto.FLOAT, ["batch", "n"])},
    )
    # no batching, fixed dims [2, 3]
    write_model(
        repo,
        "fixed",
        'backend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]\n',
        {1: test_models.unary("fixed", "Neg", TensorProto.INT32, [2, 3])},
    )
    write_model(
        repo,
        "two_vars",
        'backend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n',
        {1: test_models.unary("two_vars", "Neg", TensorProto.FLOAT, ["a", "b"])},
    )
    write_model(
        repo,
        "add",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])},
    )
    write_model(
        repo,
        "strings",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_STRING dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 4 ] } ]\n',
        {1: test_models.string_identity()},
    )
    write_model(
        repo,
        "one_string",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]\n',
        {1: test_models.unary("one_string", "Identity", TensorProto.STRING, ["batch", 1])},
    )
    server = start_server(repo, "--http-transport", request.param)
    yield server
    server.terminate()


def _split(response: httpx.Response) -> tuple[dict, bytes]:
    length = int(response.headers["inference-header-content-length"])
    import json

    return json.loads(response.content[:length]), response.content[length:]


def test_variable_dim_is_deduced_and_outputs_come_back_binary(server: ServerProcess) -> None:
    x = np.arange(6, dtype=np.float32)
    r = httpx.post(f"{server.base_url}/v2/models/neg/infer", content=x.tobytes(), headers=RAW)
    assert r.status_code == 200, r.text
    header, raw = _split(r)
    (out,) = header["outputs"]
    assert out["name"] == "OUT" and out["shape"] == [1, 6] and out["datatype"] == "FP32"
    assert out["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.float32), -x)


def test_fixed_shape_without_batching(server: ServerProcess) -> None:
    x = np.arange(6, dtype=np.int32)
    r = httpx.post(f"{server.base_url}/v2/models/fixed/versions/1/infer", content=x.tobytes(), headers=RAW)
    assert r.status_code == 200, r.text
    header, raw = _split(r)
    assert header["outputs"][0]["shape"] == [2, 3]
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.int32), -x)


def test_bytes_input_is_the_whole_body(server: ServerProcess) -> None:
    body = b"raw \x00 bytes, not JSON"
    r = httpx.post(f"{server.base_url}/v2/models/one_string/infer", content=body, headers=RAW)
    assert r.status_code == 200, r.text
    header, raw = _split(r)
    assert header["outputs"][0]["shape"] == [1, 1] and header["outputs"][0]["datatype"] == "BYTES"
    assert raw == len(body).to_bytes(4, "little") + body


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (
            "add",
            np.arange(8, dtype=np.float32).tobytes(),
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add' model configuration",
        ),
        (
            "two_vars",
            np.arange(8, dtype=np.float32).tobytes(),
            "The shape of the raw input 'IN' can not be deduced because there are more than one variable-sized dimension",
        ),
        ("strings", b"hello", "For BYTE datatype raw input 'IN', the model must have input shape [1]"),
        ("fixed", np.arange(5, dtype=np.int32).tobytes(), "unexpected total byte size 20 for input 'IN', expecting 24"),
    ],
)
def test_triton_errors_when_the_shape_cannot_be_deduced(
    server: ServerProcess, model: str, body: bytes, message: str
) -> None:
    r = httpx.post(f"{server.base_url}/v2/models/{model}/infer", content=body, headers=RAW)
    assert r.status_code == 400
    assert message in r.json()["error"]
    # the server keeps serving
    ok = httpx.post(f"{server.base_url}/v2/models/neg/infer", content=np.ones(2, np.float32).tobytes(), headers=RAW)
    assert ok.status_code == 200


def test_unknown_model_is_404(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}/v2/models/nope/infer", content=b"1234", headers=RAW)
    assert r.status_code == 404
