"""The server core over HTTP with tritonclient: results equal in-process onnxruntime, Triton-shaped metadata."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, http_transports, start_server


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module", params=http_transports())
def server(
    request: pytest.FixtureRequest, example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """This module's ``server`` (conftest's ``http_client`` talks to it): the shared example server on the
    default HTTP transport; one more on the example repository for the native transport."""
    if request.param == "asgi":
        yield request.getfixturevalue("example_server")
        return
    s = start_server(example_repository, "--http-transport", request.param, log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    assert s.terminate() == 0


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_cifar_client_code_matches_onnxruntime_for_every_batch_size(
    http_client: httpclient.InferenceServerClient, example_repository: Path, binary: bool
) -> None:
    session = _session(example_repository / "cifar10_resnet" / "1" / "model.onnx")
    rng = np.random.default_rng(1)
    for batch in range(1, 9):
        x = rng.random((batch, 3, 32, 32), dtype=np.float32)
        inp = httpclient.InferInput("input", x.shape, "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("output", binary_data=binary)
        result = http_client.infer(model_name="cifar10_resnet", inputs=[inp], outputs=[out])
        expected = session.run(None, {"input": x})[0]
        got = result.as_numpy("output")
        assert got.shape == (batch, 10) and got.dtype == np.float32
        # JSON carries floats as decimal text; binary must be bit-exact modulo thread scheduling
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert np.array_equal(np.argmax(got, 1), np.argmax(expected, 1))


@pytest.mark.parametrize("version", ["1", "2", ""])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub_every_version_and_batch_size(
    http_client: httpclient.InferenceServerClient, example_repository: Path, version: str, binary: bool
) -> None:
    session = _session(example_repository / "add_sub" / (version or "2") / "model.onnx")
    rng = np.random.default_rng(2)
    for batch in range(1, 9):
        a = rng.standard_normal((batch, 16)).astype(np.float32)
        b = rng.standard_normal((batch, 16)).astype(np.float32)
        inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", b.shape, "FP32")]
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
        result = http_client.infer("add_sub", inputs, model_version=version, outputs=outputs, request_id=f"req-{batch}")
        sum_, diff = session.run(None, {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sum_)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), diff)
        response = result.get_response()
        assert response["id"] == f"req-{batch}"
        assert response["model_version"] == (version or "2")


def test_requested_output_subset_only(http_client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    result = http_client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


def test_nested_json_data_and_parameters_are_accepted(example_server: ServerProcess) -> None:
    body = {
        "id": "nested",
        "parameters": {"custom": "value"},
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": [list(range(16)), list(range(16))]},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "FP32", "data": [1.0] * 32},
        ],
    }
    r = httpx.post(f"{example_server.base_url}/v2/models/add_sub/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["OUTPUT0"]["shape"] == [2, 16]
    assert out["OUTPUT0"]["data"][:3] == [1.0, 2.0, 3.0]
    assert r.json()["id"] == "nested"


def test_empty_outputs_list_returns_every_output(example_server: ServerProcess) -> None:
    body = {
        "outputs": [],
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ],
    }
    r = httpx.post(f"{example_server.base_url}/v2/models/add_sub/infer", json=body)
    assert r.status_code == 200, r.text
    assert [o["name"] for o in r.json()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_classification_extension(http_client: httpclient.InferenceServerClient) -> None:
    x = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
    inp = httpclient.InferInput("input", x.shape, "FP32")
    inp.set_data_from_numpy(x)
    raw = http_client.infer("cifar10_resnet", [inp]).as_numpy("output")
    top = http_client.infer("cifar10_resnet", [inp], outputs=[httpclient.InferRequestedOutput("output", class_count=3)])
    classes = top.as_numpy("output")
    assert classes.shape == (2, 3)
    for row in range(2):
        indices = [int(c.decode().split(":")[1]) for c in classes[row]]
        assert indices == list(np.argsort(-raw[row], kind="stable")[:3])


def test_server_and_model_metadata_are_triton_shaped(http_client: httpclient.InferenceServerClient) -> None:
    assert http_client.is_server_live() and http_client.is_server_ready()
    meta = http_client.get_server_metadata()
    assert meta["name"] == "kubeinfer" and "binary_tensor_data" in meta["extensions"]
    model = http_client.get_model_metadata("cifar10_resnet")
    assert model["platform"] == "onnxruntime_onnx"
    assert model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert model["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]
    assert http_client.get_model_metadata("add_sub")["versions"] == ["1", "2"]
    assert http_client.get_model_metadata("add_sub", "1")["name"] == "add_sub"
    assert http_client.is_model_ready("add_sub", "1") and http_client.is_model_ready("cifar10_resnet")
    assert not http_client.is_model_ready("add_sub", "3")
    config = http_client.get_model_config("cifar10_resnet")
    assert config["name"] == "cifar10_resnet" and config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [3, 32, 32] and config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


@pytest.fixture(scope="module")
def dtype_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("dtypes") / "repo"
    for name, model in {
        "strings": test_models.string_identity(),
        "bools": test_models.bool_not(),
        "int64s": test_models.int64_add(),
        "fp16s": test_models.fp16_add(),
    }.items():
        # minimal configs: everything else is auto-completed from the graph
        write_model(repo, name, 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n', {1: model})
    server = start_server(repo, "--allow-grpc", "false")
    yield server
    server.terminate()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_bool_int64_fp16_tensors(dtype_server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(url=dtype_server.http_url)

    def run(model: str, **arrays: np.ndarray) -> np.ndarray:
        inputs = []
        for name, array in arrays.items():
            dt = "BYTES" if array.dtype == np.object_ else httpclient.np_to_triton_dtype(array.dtype)
            inp = httpclient.InferInput(name, array.shape, dt)
            inp.set_data_from_numpy(array, binary_data=binary)
            inputs.append(inp)
        out = httpclient.InferRequestedOutput("OUT", binary_data=binary)
        return client.infer(model, inputs, outputs=[out]).as_numpy("OUT")

    words = np.array([[b"alpha", b"", "héllo".encode(), b"z" * 300]], dtype=object)
    got = run("strings", IN=words)
    # JSON carries BYTES as strings (as Triton does); binary returns the raw bytes
    expected = words if binary else np.vectorize(lambda b: b.decode(), otypes=[object])(words)
    assert got.tolist() == expected.tolist()
    flags = np.array([[True, False, True, False]])
    np.testing.assert_array_equal(run("bools", IN=flags), ~flags)
    big = np.array([[2**40, -5, 0, 7]], dtype=np.int64)
    np.testing.assert_array_equal(run("int64s", A=big, B=big), big * 2)
    half = np.array([[0.5, 1.5, -2.0, 1024.0]], dtype=np.float16)
    result = run("fp16s", A=half, B=half)
    assert result.dtype == np.float16
    np.testing.assert_array_equal(result, half + half)


def test_classification_appends_labels_from_label_filename(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    from kubeinfer.server.examples import models

    repo = tmp_path / "repo"
    write_model(
        repo,
        "labelled",
        """
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "labels.txt" } ]
        """,
        {1: models.add_sub(16)},
    )
    (repo / "labelled" / "labels.txt").write_text("\n".join(f"class-{i}" for i in range(16)) + "\n")
    server = start_server(repo)
    try:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        http = httpclient.InferenceServerClient(url=server.http_url)
        inputs = [httpclient.InferInput(n, a.shape, "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        top = http.infer("labelled", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
        assert top.as_numpy("OUTPUT0").tolist() == [[b"30.000000:15:class-15", b"28.000000:14:class-14"]]
        grpc = grpcclient.InferenceServerClient(url=server.grpc_url)
        ginputs = [grpcclient.InferInput(n, a.shape, "FP32") for n in ("INPUT0", "INPUT1")]
        for i in ginputs:
            i.set_data_from_numpy(a)
        gtop = grpc.infer("labelled", ginputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)])
        assert gtop.as_numpy("OUTPUT0").tolist() == [[b"30.000000:15:class-15"]]
    finally:
        server.terminate()


def test_missing_label_file_is_a_load_failure_with_reason(tmp_path: Path) -> None:
    from kubeinfer.server.examples import models

    repo = tmp_path / "repo"
    write_model(
        repo,
        "nolabels",
        """
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "missing.txt" } ]
        """,
        {1: models.add_sub(16)},
    )
    server = start_server(repo, "--allow-grpc", "false")
    try:
        (row,) = httpx.post(f"{server.base_url}/v2/repository/index").json()
        assert row["state"] == "UNAVAILABLE" and "cannot read label file missing.txt" in row["reason"]
    finally:
        server.terminate()


def test_the_listener_is_served_by_the_transport_asked_for(
    server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """uvicorn names itself in a ``server`` header; the native transport sends none (so the parametrized
    modules do run on both)."""
    transport = request.node.callspec.params["server"]
    r = httpx.get(f"{server.base_url}/v2/health/live", timeout=10)
    assert r.status_code == 200
    assert r.headers.get("server") == ("uvicorn" if transport == "asgi" else None), r.headers
