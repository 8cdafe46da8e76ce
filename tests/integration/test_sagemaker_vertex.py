"""Triton's SageMaker and Vertex AI listeners (server/http/sagemaker.py, server/http/vertex_ai.py), on a real
server process: routes, binary bodies, status codes and default-model selection as Triton's
src/sagemaker_server.cc and src/vertex_ai_server.cc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, free_port, start_server

ADD_CONFIG = """
name: "add"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SM_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
VX_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
VERTEX_ENV = {"AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}
A = np.arange(4, dtype=np.float32).reshape(1, 4)
B = np.full((1, 4), 10, dtype=np.float32)


@pytest.fixture(scope="module")
def add_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cloud") / "repo"
    write_model(repo, "add", ADD_CONFIG, {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])})
    return repo


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def server(add_repo: Path, ports: tuple[int, int]) -> Iterator[ServerProcess]:
    sm, vx = ports
    proc = start_server(
        add_repo,
        "--allow-sagemaker=true",
        f"--sagemaker-port={sm}",
        "--sagemaker-thread-count=2",
        "--allow-vertex-ai=true",
        f"--vertex-ai-port={vx}",
        env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add", **VERTEX_ENV},
    )
    deadline = time.monotonic() + 30  # the Vertex AI listener starts once models loaded, as Triton's
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{vx}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield proc
    proc.terminate()


def _json_request() -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": A.ravel().tolist()},
                {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": B.ravel().tolist()},
            ]
        }
    ).encode()


def _binary_request() -> tuple[bytes, int]:
    inputs = []
    for name, value in (("A", A), ("B", B)):
        tensor = httpclient.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(value, binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    assert json_size is not None
    return body, json_size


def _binary_out(response: httpx.Response, mime: str | None) -> np.ndarray:
    if mime is None:
        size = int(response.headers["inference-header-content-length"])
    else:
        assert response.headers["content-type"].startswith(mime)
        size = int(response.headers["content-type"][len(mime) :])
    head = json.loads(response.content[:size])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 16
    return np.frombuffer(response.content[size:], dtype=np.float32)


def test_sagemaker_ping_and_invocations(server: ServerProcess, ports: tuple[int, int]) -> None:
    base = f"http://127.0.0.1:{ports[0]}"
    assert httpx.get(f"{base}/ping").status_code == 200
    assert httpx.post(f"{base}/ping").status_code == 405  # Triton's HandleServerHealth: GET only
    # JSON: the model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names
    r = httpx.post(f"{base}/invocations", content=_json_request(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["model_name"] == "add"
    assert r.json()["outputs"][0]["data"] == (A + B).ravel().tolist()
    # binary tensors: the JSON header's length in the content type, both ways
    body, json_size = _binary_request()
    r = httpx.post(f"{base}/invocations", content=body, headers={"content-type": f"{SM_MIME}{json_size}"})
    assert r.status_code == 200, r.text
    assert _binary_out(r, SM_MIME).tolist() == (A + B).ravel().tolist()


def test_sagemaker_errors(server: ServerProcess, ports: tuple[int, int]) -> None:
    base = f"http://127.0.0.1:{ports[0]}"
    assert httpx.get(f"{base}/invocations").status_code == 405
    r = httpx.post(f"{base}/invocations", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    body, _ = _binary_request()
    r = httpx.post(f"{base}/invocations", content=body, headers={"content-type": f"{SM_MIME}{len(body) + 1}"})
    assert r.status_code == 400
    assert r.json()["error"] == f"inference header size should be in range (0, {len(body)}), got: {len(body) + 1}"
    r = httpx.post(f"{base}/invocations", content=body, headers={"content-type": f"text/plain; {SM_MIME}4"})
    assert r.status_code == 400
    assert r.json()["error"].startswith(f"expect MIME type for binary data starts with '{SM_MIME}', got: ")
    # json-header-size=0: the body is the model's one input, raw; "add" has two
    r = httpx.post(f"{base}/invocations", content=A.tobytes(), headers={"content-type": f"{SM_MIME}0"})
    assert r.status_code == 400 and "error" in r.json()
    # multi-model routes: nothing was loaded through POST /models, so nothing is listed or invoked
    assert httpx.get(f"{base}/models").json() == {"models": []}
    assert httpx.get(f"{base}/models/add").status_code == 404
    assert httpx.post(f"{base}/models/add/invoke", content=_json_request()).status_code == 404
    assert httpx.delete(f"{base}/models/add").status_code == 404
    r = httpx.post(f"{base}/models", json={"model_name": "m", "url": "/opt/ml/models/m/model"})
    assert r.status_code == 400 and "not supported" in r.json()["error"]
    assert httpx.get(f"{base}/v2/health/ready").status_code == 400  # not a SageMaker route: 400, empty
    assert httpx.get(f"{base}/v2/health/ready").content == b""


def test_vertex_health_predict_and_redirect(server: ServerProcess, ports: tuple[int, int]) -> None:
    base = f"http://127.0.0.1:{ports[1]}"
    assert httpx.get(f"{base}/health").status_code == 200
    # the default model: the repository's only one
    r = httpx.post(f"{base}/predict", content=_json_request())
    assert r.status_code == 200, r.text
    assert r.json()["model_name"] == "add"
    assert r.json()["outputs"][0]["data"] == (A + B).ravel().tolist()
    body, json_size = _binary_request()
    r = httpx.post(f"{base}/predict", content=body, headers={"content-type": f"{VX_MIME}{json_size}"})
    assert r.status_code == 200, r.text
    assert _binary_out(r, None).tolist() == (A + B).ravel().tolist()  # answered as the HTTP listener answers
    # redirect to other v2 endpoints (POST only; the handler gets the method it expects)
    redirect = "X-Vertex-Ai-Triton-Redirect"
    r = httpx.post(f"{base}/predict", headers={redirect: "v2/models/add/infer"}, content=_json_request())
    assert r.status_code == 200 and r.json()["model_name"] == "add"
    assert httpx.post(f"{base}/predict", headers={redirect: "v2/models/add/ready"}).status_code == 200
    assert httpx.post(f"{base}/predict", headers={redirect: "v2/health/live"}).status_code == 200
    assert httpx.post(f"{base}/predict", headers={redirect: "v2/models/add/config"}).json()["name"] == "add"
    assert httpx.post(f"{base}/predict", headers={redirect: "v2"}).json()["name"]
    assert "nv_inference_request_success" in httpx.post(f"{base}/predict", headers={redirect: "metrics"}).text
    assert httpx.get(f"{base}/predict", headers={redirect: "v2/models/add/ready"}).status_code == 405
    assert httpx.post(f"{base}/predict", headers={redirect: "v2/nothing"}).status_code == 400
    assert httpx.get(f"{base}/predict").status_code == 405
    assert httpx.get(f"{base}/elsewhere").status_code == 400


def test_vertex_errors_match_the_http_listener(server: ServerProcess, ports: tuple[int, int]) -> None:
    base = f"http://127.0.0.1:{ports[1]}"
    for body in (b"{not json", json.dumps({"inputs": [{"name": "A"}]}).encode()):
        ours = httpx.post(f"{base}/predict", content=body)
        http = httpx.post(f"{server.base_url}/v2/models/add/infer", content=body)
        assert (ours.status_code, ours.json()) == (http.status_code, http.json())
        assert ours.status_code == 400
    ours = httpx.post(f"{base}/predict", headers={"X-Vertex-Ai-Triton-Redirect": "v2/models/nope/infer"}, content=b"{}")
    http = httpx.post(f"{server.base_url}/v2/models/nope/infer", content=b"{}")
    assert (ours.status_code, ours.json()) == (http.status_code, http.json())


def test_sagemaker_default_model_unset_and_vertex_default_model_missing(add_repo: Path, tmp_path: Path) -> None:
    sm = free_port()
    proc = start_server(add_repo, "--allow-sagemaker=true", f"--sagemaker-port={sm}", log_dir=tmp_path)
    try:
        r = httpx.post(f"http://127.0.0.1:{sm}/invocations", content=_json_request())
        assert r.status_code != 200
        assert "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in r.json()["error"]
    finally:
        proc.terminate()
    # Triton: the Vertex AI listener cannot start without its default model loaded, and the server stops
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.server",
            f"--model-repository={add_repo}",
            "--host=127.0.0.1",
            f"--http-port={free_port()}",
            f"--grpc-port={free_port()}",
            f"--metrics-port={free_port()}",
            "--allow-vertex-ai=true",
            f"--vertex-ai-port={free_port()}",
            "--vertex-ai-default-model=nope",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **VERTEX_ENV},
    )
    assert done.returncode == 1
    assert "failed to start Vertex AI service: Expect the default model 'nope' is loaded" in done.stderr


def test_vertex_needs_its_routes(add_repo: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.server", f"--model-repository={add_repo}", "--allow-vertex-ai=true"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("AIP_")},
    )
    assert done.returncode == 2
    assert "API_PREDICT_ROUTE is not defined for Vertex AI endpoint" in done.stderr
