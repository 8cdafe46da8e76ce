"""Bad input gets a clear 4xx with a message, and the server keeps serving every other request."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

ADD_SUB_CONFIG = Path(__file__).resolve().parents[2] / "server/examples/model_repository/add_sub/config.pbtxt"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, example_repository: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("bad") / "repo"
    shutil.copytree(example_repository, repo)
    # a config that does not parse
    broken = repo / "broken_config"
    shutil.copytree(repo / "add_sub", broken)
    (broken / "config.pbtxt").write_text('name: "broken_config"\nmax_batch_size: eight\n')
    # a config that parses but contradicts itself
    invalid = repo / "invalid_config"
    shutil.copytree(repo / "add_sub", invalid)
    (invalid / "config.pbtxt").write_text(
        ADD_SUB_CONFIG.read_text().replace('name: "add_sub"', 'name: "invalid_config"').replace("[ 16 ]", "[ 0 ]", 1)
    )
    # a corrupt ONNX file
    write_model(repo, "corrupt_onnx", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n', {1: b"\x08\x07garbage"})
    s = start_server(repo, "--allow-grpc", "false")
    yield s
    s.terminate()


def _post(server: ServerProcess, path: str, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", content=content, headers=headers or {}, timeout=30)


def _good_request(server: ServerProcess) -> None:
    """After every bad request: the same server still answers correctly."""
    client = httpclient.InferenceServerClient(url=server.http_url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    r = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)
    assert client.is_server_ready()


def _json_request(
    shape: list[int],
    datatype: str = "FP32",
    data: list[float] | None = None,
    names: tuple[str, ...] = ("INPUT0", "INPUT1"),
) -> bytes:
    n = int(np.prod(shape))
    return json.dumps(
        {
            "inputs": [
                {"name": name, "shape": shape, "datatype": datatype, "data": data if data is not None else [1] * n}
                for name in names
            ]
        }
    ).encode()


def _binary_request(
    arrays: dict[str, np.ndarray], declared: dict[str, int] | None = None, truncate: int = 0
) -> tuple[bytes, dict[str, str]]:
    inputs = []
    raw = b""
    for name, a in arrays.items():
        size = (declared or {}).get(name, a.nbytes)
        inputs.append(
            {"name": name, "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": size}}
        )
        raw += a.tobytes()
    header = json.dumps({"inputs": inputs}).encode()
    body = header + raw
    if truncate:
        body = body[:-truncate]
    return body, {"Inference-Header-Content-Length": str(len(header))}


CASES = {
    "wrong_shape": (
        lambda: _json_request([1, 15]),
        400,
        r"unexpected shape for input 'INPUT0' for model 'add_sub'. "
        r"Expected \[-1, 16\], got \[1, 15\]",
    ),
    "wrong_datatype": (
        lambda: _json_request([1, 16], "INT32"),
        400,
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    "unknown_datatype": (lambda: _json_request([1, 16], "FLOAT99"), 400, "invalid datatype 'FLOAT99'"),
    "element_count_mismatch": (
        lambda: _json_request([1, 16], data=[1.0] * 15),
        400,
        r"input 'INPUT0' has 15 elements in its data but shape \[1, 16\] needs 16",
    ),
    "non_numeric_data": (lambda: _json_request([1, 2], data=["a", "b"]), 400, "FP32 data must be numbers"),
    "missing_input": (
        lambda: _json_request([1, 16], names=("INPUT0",)),
        400,
        r"expected 2 inputs but got 1 inputs for model 'add_sub'\. Got input\(s\) \['INPUT0'\], but missing "
        r"required input\(s\) \['INPUT1'\]\. Please provide all required input\(s\)\.",
    ),
    "unknown_input": (
        lambda: _json_request([1, 16], names=("INPUT0", "INPUT1", "EXTRA")),
        400,
        "unexpected inference input 'EXTRA' for model 'add_sub'",
    ),
    "batch_too_large": (
        lambda: _json_request([9, 16]),
        400,
        "inference request batch-size must be <= 8 for 'add_sub', got 9",
    ),
    "negative_dim": (lambda: _json_request([-1, 16], data=[]), 400, "has a negative dimension"),
    # Triton's text (rapidjson's message and offset), as its qa tests match it
    "malformed_json": (lambda: b'{"inputs": [', 400, "failed to parse the request JSON buffer: Invalid value. at 12"),
    "whitespace_only": (lambda: b"\n", 400, "failed to parse the request JSON buffer: The document is empty. at 1"),
    "not_an_object": (lambda: b"[1, 2]", 400, "must be a JSON object"),
    "no_inputs": (lambda: b"{}", 400, "must have an 'inputs' list"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_json_requests(server: ServerProcess, case: str) -> None:
    make, status, message = CASES[case]
    r = _post(server, "/v2/models/add_sub/infer", make())
    assert r.status_code == status, r.text
    assert "error" in r.json()
    import re

    assert re.search(message, r.json()["error"]), r.json()["error"]
    _good_request(server)


#: every route that takes a JSON body (a zero-byte body is "no body": the defaults)
JSON_ROUTES = [
    "/v2/logging",
    "/v2/trace/setting",
    "/v2/models/add_sub/trace/setting",
    "/v2/repository/index",
    "/v2/repository/models/add_sub/load",
    "/v2/repository/models/missing_model/unload",
    "/v2/models/add_sub/generate",
    "/v2/models/add_sub/infer",
]


@pytest.mark.parametrize("path", JSON_ROUTES)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\n", "failed to parse the request JSON buffer: The document is empty. at 1"),
        (b" \t\r\n", "failed to parse the request JSON buffer: The document is empty. at 4"),
        (b'{"a": 1,}', "failed to parse the request JSON buffer: Missing a name for object member. at 8"),
        (b'{"a" 1}', "failed to parse the request JSON buffer: Missing a colon after a name of object member. at 5"),
        (
            b'{"a": [1 2]}',
            "failed to parse the request JSON buffer: Missing a comma or ']' after an array element. at 9",
        ),
        (
            b'{"a": 1 "b": 2}',
            "failed to parse the request JSON buffer: Missing a comma or '}' after an object member. at 8",
        ),
        (
            b"{} {}",
            "failed to parse the request JSON buffer: The document root must not be followed by other values. at 3",
        ),
        (b"NaN", "failed to parse the request JSON buffer: Invalid value. at 0"),
    ],
)
def test_unparsable_json_bodies_are_400_with_tritons_text(
    server: ServerProcess, path: str, body: bytes, message: str
) -> None:
    """A body that is not JSON is a 400 with Triton's parse error on every route that takes JSON, never the
    route's defaults (a lone newline once changed nothing and answered 200 on /v2/logging)."""
    r = _post(server, path, body, {"Content-Type": "application/json"})
    assert r.status_code == 400, (path, body, r.status_code, r.text)
    assert r.json() == {"error": message}


@pytest.mark.parametrize("path", ["/v2/logging", "/v2/trace/setting", "/v2/repository/index"])
def test_json_routes_take_a_zero_byte_body_as_the_defaults(server: ServerProcess, path: str) -> None:
    r = _post(server, path, b"")
    assert r.status_code == 200, r.text


def test_byte_size_not_matching_shape(server: ServerProcess) -> None:
    a = np.ones((1, 16), np.float32)
    body, headers = _binary_request({"INPUT0": a[:, :8], "INPUT1": a})
    body_json = json.loads(body[: int(headers["Inference-Header-Content-Length"])])
    body_json["inputs"][0]["shape"] = [1, 16]  # declares 16 floats, sends 8
    header = json.dumps(body_json).encode()
    raw = a[:, :8].tobytes() + a.tobytes()
    r = _post(server, "/v2/models/add_sub/infer", header + raw, {"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400
    assert "unexpected total byte size 32 for input 'INPUT0', expecting 64" in r.json()["error"]
    _good_request(server)


def test_truncated_binary_body(server: ServerProcess) -> None:
    a = np.ones((1, 16), np.float32)
    body, headers = _binary_request({"INPUT0": a, "INPUT1": a}, truncate=10)
    r = _post(server, "/v2/models/add_sub/infer", body, headers)
    assert r.status_code == 400
    assert "declares binary_data_size 64 but only 54 bytes" in r.json()["error"]
    _good_request(server)


def test_header_length_larger_than_body(server: ServerProcess) -> None:
    a = np.ones((1, 16), np.float32)
    body, _ = _binary_request({"INPUT0": a, "INPUT1": a})
    r = _post(server, "/v2/models/add_sub/infer", body, {"Inference-Header-Content-Length": str(len(body) + 100)})
    assert r.status_code == 400
    assert "is larger than the request body" in r.json()["error"]
    r = _post(server, "/v2/models/add_sub/infer", body, {"Inference-Header-Content-Length": "abc"})
    assert r.status_code == 400 and "is not an integer" in r.json()["error"]
    _good_request(server)


def test_extra_bytes_after_tensors(server: ServerProcess) -> None:
    a = np.ones((1, 16), np.float32)
    body, headers = _binary_request({"INPUT0": a, "INPUT1": a})
    r = _post(server, "/v2/models/add_sub/infer", body + b"junk", headers)
    assert r.status_code == 400 and "4 bytes beyond its declared tensors" in r.json()["error"]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/v2/models/nope/infer", 404, "Request for unknown model: 'nope' is not found"),
        ("/v2/models/add_sub/versions/7/infer", 404, "'add_sub' version 7 is not found"),
        # Triton's routes take numeric versions only (http_server.cc model_regex_)
        ("/v2/models/add_sub/versions/x/infer", 404, "Not Found"),
    ],
)
def test_unknown_model_or_version(server: ServerProcess, path: str, status: int, message: str) -> None:
    r = _post(server, path, _json_request([1, 16]))
    assert r.status_code == status
    assert message in r.json()["error"]
    with pytest.raises(InferenceServerException, match="unknown model"):
        httpclient.InferenceServerClient(url=server.http_url).get_model_metadata("nope")
    _good_request(server)


def test_broken_models_report_why_and_the_rest_serve(server: ServerProcess) -> None:
    index = httpx.post(f"{server.base_url}/v2/repository/index", timeout=10).json()
    by_name = {row["name"]: row for row in index}
    assert by_name["broken_config"]["state"] == "UNAVAILABLE"
    assert "failed to parse config.pbtxt" in by_name["broken_config"]["reason"]
    assert by_name["invalid_config"]["state"] == "UNAVAILABLE"
    assert "every dim must be a positive size or -1" in by_name["invalid_config"]["reason"]
    assert by_name["corrupt_onnx"]["state"] == "UNAVAILABLE"
    assert "cannot read ONNX model model.onnx" in by_name["corrupt_onnx"]["reason"]
    for healthy in ("add_sub", "cifar10_resnet"):
        assert by_name[healthy]["state"] == "READY"
    r = _post(server, "/v2/models/corrupt_onnx/infer", _json_request([1, 4], names=("IN",)))
    assert r.status_code == 503
    assert "cannot read ONNX model" in r.json()["error"]
    # Triton answers 400 {"error":"Model version not ready"}
    assert httpx.get(f"{server.base_url}/v2/models/broken_config/ready").status_code == 400
    assert httpx.get(f"{server.base_url}/v2/health/ready").status_code == 200
    _good_request(server)
