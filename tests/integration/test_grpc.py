"""The gRPC front end with the real ``tritonclient.grpc`` against a real server process.

Every answer is compared with the HTTP front end of the same server and, for inference, with
onnxruntime run in-process on the same model file.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.repos import copy_example_repository, write_model
from tests.support.server import ServerProcess, grpc_transports, start_server

IDENTITY_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "IN" data_type: {dtype} dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: {dtype} dims: [ -1 ] }} ]
"""


def identity(elem_type: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])],
        "identity",
        [helper.make_tensor_value_info("IN", elem_type, ["n"])],
        [helper.make_tensor_value_info("OUT", elem_type, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_example_repository(tmp_path_factory.mktemp("grpc") / "repo")
    for name, dtype, elem in (
        ("identity_fp32", "TYPE_FP32", TensorProto.FLOAT),
        ("identity_int16", "TYPE_INT16", TensorProto.INT16),
        ("identity_bytes", "TYPE_STRING", TensorProto.STRING),
    ):
        write_model(repo, name, IDENTITY_CONFIG.format(name=name, dtype=dtype), {1: identity(elem)})
    return repo


@pytest.fixture(scope="module", params=grpc_transports())
def transport(request: pytest.FixtureRequest) -> str:
    """Every test runs on each gRPC transport (--grpc-transport)."""
    return str(request.param)


@pytest.fixture(scope="module")
def server(repo: Path, transport: str) -> Iterator[ServerProcess]:
    s = start_server(repo, "--grpc-transport", transport)
    yield s
    assert s.terminate() == 0


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """tritonclient's own generated stub, for requests its high-level client cannot build (typed contents)."""
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def add_sub_inputs(module: object, batch: int = 2) -> tuple[list, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 16)).astype(np.float32)
    b = rng.standard_normal((batch, 16)).astype(np.float32)
    inputs = [module.InferInput("INPUT0", [batch, 16], "FP32"), module.InferInput("INPUT1", [batch, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def grpc_error(fn, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        fn(*args, **kwargs)
    return info.value


def http_error(server: ServerProcess, method: str, path: str, **kwargs) -> tuple[int, str]:
    r = httpx.request(method, server.base_url + path, timeout=30, **kwargs)
    return r.status_code, r.json()["error"]


# ---- health and metadata ----------------------------------------------------------------------
def test_health(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("add_sub")
    assert grpc_client.is_model_ready("add_sub", "1")
    assert not grpc_client.is_model_ready("add_sub", "7")
    assert not grpc_client.is_model_ready("missing")


def test_server_metadata_matches_http(grpc_client, http_client) -> None:
    g = grpc_client.get_server_metadata(as_json=True)
    h = http_client.get_server_metadata()
    assert g["name"] == h["name"] == "kubeinfer"
    assert g["version"] == h["version"]
    assert g["extensions"] == h["extensions"]


@pytest.mark.parametrize("version", ["", "1"])
def test_model_metadata_matches_http(grpc_client, http_client, version: str) -> None:
    g = grpc_client.get_model_metadata("cifar10_resnet", version, as_json=True)
    h = http_client.get_model_metadata("cifar10_resnet", version)
    assert g["name"] == h["name"] and g["versions"] == h["versions"] and g["platform"] == h["platform"]
    for kind in ("inputs", "outputs"):
        assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in g[kind]] == [
            (t["name"], t["datatype"], t["shape"]) for t in h[kind]
        ]
    assert [int(d) for d in g["inputs"][0]["shape"]] == [-1, 3, 32, 32]


def test_model_config_matches_http(grpc_client, http_client) -> None:
    g = grpc_client.get_model_config("cifar10_resnet", as_json=True)["config"]
    h = http_client.get_model_config("cifar10_resnet")
    assert g["name"] == h["name"] == "cifar10_resnet"
    assert g["max_batch_size"] == h["max_batch_size"] == 8
    assert [(t["name"], [int(d) for d in t["dims"]]) for t in g["input"]] == [
        (t["name"], t["dims"]) for t in h["input"]
    ]
    assert "dynamic_batching" in g and "dynamic_batching" in h
    # the message itself decodes into tritonclient's ModelConfig, field for field
    cfg = grpc_client.get_model_config("add_sub", "2").config
    assert cfg.version_policy.HasField("all") and cfg.input[0].dims == [16]


# ---- inference --------------------------------------------------------------------------------
def test_infer_raw_matches_http_and_onnxruntime(grpc_client, http_client, repo: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    gin = grpcclient.InferInput("input", list(images.shape), "FP32")
    gin.set_data_from_numpy(images)
    hin = httpclient.InferInput("input", list(images.shape), "FP32")
    hin.set_data_from_numpy(images, binary_data=True)
    g = grpc_client.infer("cifar10_resnet", [gin], request_id="r-1")
    h = http_client.infer("cifar10_resnet", [hin])
    model_file = repo / "cifar10_resnet" / "1" / "model.onnx"
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"input": images})
    assert g.get_response().id == "r-1"
    assert g.get_response().model_version == "1"
    np.testing.assert_allclose(g.as_numpy("output"), h.as_numpy("output"), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)

    inputs, a, b = add_sub_inputs(grpcclient, batch=3)
    r = grpc_client.infer("add_sub", inputs, model_version="1")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def test_requested_outputs_and_classification(grpc_client, http_client) -> None:
    inputs, a, b = add_sub_inputs(grpcclient)
    r = grpc_client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in r.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r.as_numpy("OUTPUT0") is None

    g = grpc_client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    hin, _, _ = add_sub_inputs(httpclient)
    h = http_client.infer("add_sub", hin, outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    top = g.as_numpy("OUTPUT0")
    assert top.shape == (2, 3)
    np.testing.assert_array_equal(top, h.as_numpy("OUTPUT0"))
    best = [int(s.split(b":")[1]) for s in top[:, 0]]
    assert best == list(np.argmax(a + b, axis=1))


def test_typed_contents(stub) -> None:
    """InferTensorContents per datatype, including narrow ints and BYTES (raw is what tritonclient sends)."""
    req = service_pb2.ModelInferRequest(model_name="add_sub")
    a, b = np.arange(16, dtype=np.float32), np.full(16, 0.5, np.float32)
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(data.tolist())
    resp = stub.ModelInfer(req)
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    out0 = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(list(resp.outputs[0].shape))
    np.testing.assert_array_equal(out0, (a + b).reshape(1, 16))

    req = service_pb2.ModelInferRequest(model_name="identity_int16")
    req.inputs.add(name="IN", datatype="INT16", shape=[4]).contents.int_contents.extend([-32768, -1, 0, 32767])
    resp = stub.ModelInfer(req)
    assert resp.outputs[0].datatype == "INT16"
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<i2"), [-32768, -1, 0, 32767])

    req = service_pb2.ModelInferRequest(model_name="identity_bytes")
    req.inputs.add(name="IN", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"hello", b""])
    resp = stub.ModelInfer(req)
    assert resp.outputs[0].datatype == "BYTES"
    assert resp.raw_output_contents[0] == b"\x05\x00\x00\x00hello\x00\x00\x00\x00"

    # out of range for INT16, wrong element count: INVALID_ARGUMENT with a message, server still up
    req = service_pb2.ModelInferRequest(model_name="identity_int16")
    req.inputs.add(name="IN", datatype="INT16", shape=[1]).contents.int_contents.append(40000)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "do not fit INT16" in info.value.details()
    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="IN", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2 elements" in info.value.details()


def test_request_parameters(grpc_client, stub) -> None:
    inputs, a, b = add_sub_inputs(grpcclient)
    r = grpc_client.infer("add_sub", inputs, timeout=30_000_000, parameters={"custom": "kept"})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="IN", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    req.parameters["priority"].string_param = "high"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'priority' must be a non-negative integer" in info.value.details()


def test_bytes_raw_roundtrip(grpc_client) -> None:
    data = np.array([b"a", b"", "unicode \u00e9".encode()], dtype=np.object_)  # ORT strings must be UTF-8
    inp = grpcclient.InferInput("IN", [3], "BYTES")
    inp.set_data_from_numpy(data)
    out = grpc_client.infer("identity_bytes", [inp]).as_numpy("OUT")
    assert list(out) == list(data)


def test_large_message_beyond_grpc_default(grpc_client) -> None:
    """Default max message is 256 MiB: a 24 MiB tensor (gRPC's own default is 4 MiB) goes both ways."""
    data = np.arange(6 * 1024 * 1024, dtype=np.float32)
    inp = grpcclient.InferInput("IN", [data.size], "FP32")
    inp.set_data_from_numpy(data)
    out = grpc_client.infer("identity_fp32", [inp]).as_numpy("OUT")
    np.testing.assert_array_equal(out, data)


def test_max_message_flag(tmp_path: Path, repo: Path, transport: str) -> None:
    small = start_server(
        repo,
        "--grpc-transport",
        transport,
        "--grpc-max-message-bytes",
        "65536",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "identity_fp32",
        log_dir=tmp_path,
    )
    try:
        c = grpcclient.InferenceServerClient(small.grpc_url)
        inp = grpcclient.InferInput("IN", [32 * 1024], "FP32")
        inp.set_data_from_numpy(np.zeros(32 * 1024, np.float32))
        err = grpc_error(c.infer, "identity_fp32", [inp])
        assert err.status() == "StatusCode.RESOURCE_EXHAUSTED"
        inp = grpcclient.InferInput("IN", [1024], "FP32")
        inp.set_data_from_numpy(np.ones(1024, np.float32))
        assert c.infer("identity_fp32", [inp]).as_numpy("OUT").sum() == 1024
        c.close()
    finally:
        assert small.terminate() == 0


def test_stream_infer(grpc_client) -> None:
    results: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        expected = {}
        for i in range(8):
            inputs, a, b = add_sub_inputs(grpcclient, batch=1 + i % 4)
            expected[f"s{i}"] = a + b
            grpc_client.async_stream_infer("add_sub", inputs, request_id=f"s{i}")
        bad, _, _ = add_sub_inputs(grpcclient)
        grpc_client.async_stream_infer("missing_model", bad, request_id="bad")
        inputs, a, b = add_sub_inputs(grpcclient, batch=2)
        expected["after"] = a + b
        grpc_client.async_stream_infer("add_sub", inputs, request_id="after")
        got, errors = {}, []
        for _ in range(len(expected) + 1):
            result, error = results.get(timeout=60)
            if error is not None:
                errors.append(str(error))
            else:
                got[result.get_response().id] = result.as_numpy("OUTPUT0")
    finally:
        grpc_client.stop_stream()
    assert len(errors) == 1 and "unknown model: 'missing_model'" in errors[0]
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)


def test_statistics_match_http(grpc_client, http_client) -> None:
    before = grpc_client.get_inference_statistics("add_sub", "2", as_json=True)["model_stats"][0]
    inputs, _, _ = add_sub_inputs(grpcclient, batch=2)
    for _ in range(3):
        grpc_client.infer("add_sub", inputs, model_version="2")
    g = grpc_client.get_inference_statistics("add_sub", "2", as_json=True)["model_stats"][0]
    h = http_client.get_inference_statistics("add_sub", "2")["model_stats"][0]
    successes_before = int(before["inference_stats"]["success"].get("count", 0))
    assert int(g["inference_count"]) - int(before.get("inference_count", 0)) == 6
    assert int(g["inference_stats"]["success"]["count"]) - successes_before == 3
    assert int(g["inference_count"]) == h["inference_count"]
    assert int(g["inference_stats"]["success"]["count"]) == h["inference_stats"]["success"]["count"]
    everything = grpc_client.get_inference_statistics(as_json=True)["model_stats"]
    served = {(s["name"], s["version"]) for s in everything}
    assert served >= {("add_sub", "1"), ("add_sub", "2"), ("cifar10_resnet", "1")}


def test_repository_index(grpc_client, http_client) -> None:
    g = grpc_client.get_model_repository_index(as_json=True)["models"]
    h = http_client.get_model_repository_index()
    assert [(m["name"], m.get("version", ""), m.get("state", "")) for m in g] == [
        (m["name"], m.get("version", ""), m.get("state", "")) for m in h
    ]
    assert ("add_sub", "2", "READY") in [(m["name"], m["version"], m["state"]) for m in g]


# ---- errors: same status family and message as HTTP -------------------------------------------
def test_errors_match_http(grpc_client, server: ServerProcess) -> None:
    inputs, _, _ = add_sub_inputs(grpcclient)
    err = grpc_error(grpc_client.infer, "missing", inputs)
    status, message = http_error(server, "POST", "/v2/models/missing/infer", json={"inputs": []})
    assert err.status() == "StatusCode.NOT_FOUND" and status == 404
    assert err.message() == message

    bad = grpcclient.InferInput("INPUT0", [1, 15], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 15), np.float32))
    ok = grpcclient.InferInput("INPUT1", [1, 15], "FP32")
    ok.set_data_from_numpy(np.zeros((1, 15), np.float32))
    err = grpc_error(grpc_client.infer, "add_sub", [bad, ok])
    body = {
        "inputs": [{"name": n, "datatype": "FP32", "shape": [1, 15], "data": [0.0] * 15} for n in ("INPUT0", "INPUT1")]
    }
    status, message = http_error(server, "POST", "/v2/models/add_sub/infer", json=body)
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and status == 400
    assert err.message() == message and "unexpected shape" in message

    err = grpc_error(grpc_client.infer, "add_sub", inputs, model_version="9")
    assert err.status() == "StatusCode.NOT_FOUND"

    # the example server runs in model control mode "none": load/unload are refused, as over HTTP (Triton's
    # status and text)
    err = grpc_error(grpc_client.load_model, "add_sub")
    status, message = http_error(server, "POST", "/v2/repository/models/add_sub/load")
    assert err.status() == "StatusCode.UNAVAILABLE" and status == 503
    assert err.message() == message == "explicit model load / unload is not allowed if polling is enabled"
    err = grpc_error(grpc_client.unload_model, "add_sub")
    assert err.status() == "StatusCode.UNAVAILABLE"

    err = grpc_error(grpc_client.get_model_metadata, "missing")
    assert err.status() == "StatusCode.NOT_FOUND"
    err = grpc_error(grpc_client.get_model_config, "missing")
    assert err.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_system_shared_memory_status(),
        lambda c: c.unregister_cuda_shared_memory(),
    ],
)
def test_shared_memory_is_refused_unless_allowed(grpc_client, call) -> None:
    """Without --allow-client-shm (Triton 26.04+'s default) the shared-memory RPCs say how to enable them."""
    err = grpc_error(call, grpc_client)
    assert err.status() == "StatusCode.UNIMPLEMENTED"
    assert "--allow-client-shm=true" in err.message()
    assert grpc_client.is_server_live()


def test_every_triton_rpc_is_served(grpc_client) -> None:
    assert grpc_client.get_trace_settings(as_json=True)["settings"]["trace_level"] == {"value": ["OFF"]}
    assert grpc_client.get_log_settings(as_json=True)["settings"]["log_info"] == {"bool_param": True}
