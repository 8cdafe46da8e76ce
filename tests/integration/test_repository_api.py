"""Explicit model control: the repository API over HTTP and gRPC (index, load with a config override,
unload), model-name validation, and reload through the API without unloading first.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from tritonclient.utils import InferenceServerException

from tests.support.repos import copy_example_repository
from tests.support.server import ServerProcess, http_transports, start_server


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_example_repository(tmp_path_factory.mktemp("explicit") / "repo")


@pytest.fixture(scope="module", params=http_transports())
def server(request: pytest.FixtureRequest, repo: Path) -> Iterator[ServerProcess]:
    s = start_server(
        repo, "--model-control-mode", "explicit", "--load-model", "add_sub", "--http-transport", request.param
    )
    yield s
    assert s.terminate() == 0


def post(server: ServerProcess, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body if body is not None else {}, timeout=120)


def index(server: ServerProcess, ready: bool = False) -> list[tuple[str, str, str]]:
    rows = post(server, "/v2/repository/index", {"ready": ready}).json()
    return [(r["name"], r.get("version", ""), r.get("state", "")) for r in rows]


def add_sub_infer(client: grpcclient.InferenceServerClient, batch: int = 1, version: str = "") -> np.ndarray:
    a = np.ones((batch, 16), np.float32)
    inputs = [grpcclient.InferInput(n, [batch, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(a)
    return client.infer("add_sub", inputs, model_version=version).as_numpy("OUTPUT0")


def add_sub_override(max_batch_size: int, versions: list[int] | None = None, dims: int = 16) -> dict:
    config: dict = {
        "name": "add_sub",
        "platform": "onnxruntime_onnx",
        "max_batch_size": max_batch_size,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [dims]} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [dims]} for n in ("OUTPUT0", "OUTPUT1")],
    }
    if versions:
        config["version_policy"] = {"specific": {"versions": versions}}
    return config


def test_startup_loads_only_named_models(server: ServerProcess, grpc_client) -> None:
    rows = index(server)
    assert ("add_sub", "1", "READY") in rows and ("add_sub", "2", "READY") in rows
    assert ("cifar10_resnet", "", "") in rows  # in the repository, not loaded
    assert all(name == "add_sub" for name, _, _ in index(server, ready=True))
    assert not grpc_client.is_model_ready("cifar10_resnet")
    assert grpc_client.is_server_ready()
    grpc_rows = grpc_client.get_model_repository_index().models
    assert {(m.name, m.version, m.state) for m in grpc_rows} == set(rows)


def test_load_and_unload_over_both_protocols(server: ServerProcess, grpc_client, http_client) -> None:
    grpc_client.load_model("cifar10_resnet")
    assert http_client.is_model_ready("cifar10_resnet")
    image = np.zeros((1, 3, 32, 32), np.float32)
    inp = grpcclient.InferInput("input", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(image)
    assert grpc_client.infer("cifar10_resnet", [inp]).as_numpy("output").shape == (1, 10)

    assert post(server, "/v2/repository/models/cifar10_resnet/unload").status_code == 200
    assert not grpc_client.is_model_ready("cifar10_resnet")
    assert ("cifar10_resnet", "1", "UNAVAILABLE") in index(server)
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("cifar10_resnet", [inp])
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    r = httpx.post(
        f"{server.base_url}/v2/models/cifar10_resnet/infer",
        timeout=30,
        json={"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}]},
    )
    assert r.status_code == 503 and "no available versions" in r.json()["error"]

    http_client.load_model("cifar10_resnet")
    assert grpc_client.is_model_ready("cifar10_resnet")
    grpc_client.unload_model("cifar10_resnet", unload_dependents=True)
    assert not http_client.is_model_ready("cifar10_resnet")
    assert (
        post(
            server, "/v2/repository/models/cifar10_resnet/unload", {"parameters": {"unload_dependents": True}}
        ).status_code
        == 200
    )


def test_unknown_models_answer_as_triton(server: ServerProcess, grpc_client, http_client) -> None:
    """Checked against Triton 2.51 in explicit mode: unloading a model it does not know succeeds; loading one
    the repository does not hold says "failed to load 'X', failed to poll from model repository" (its log
    says why; we add it) — Triton answers 500 / INTERNAL, we 400 / INVALID_ARGUMENT (a client's mistake)."""
    r = post(server, "/v2/repository/models/never_loaded/unload")
    assert (r.status_code, r.content) == (200, b"")
    grpc_client.unload_model("never_loaded")
    message = (
        "failed to load 'not_in_repo', failed to poll from model repository: model not found in any model repository"
    )
    r = post(server, "/v2/repository/models/not_in_repo/load")
    assert (r.status_code, r.json()) == (400, {"error": message})
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model("not_in_repo")
    assert (info.value.status(), info.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)
    with pytest.raises(InferenceServerException) as info:
        http_client.load_model("not_in_repo")
    assert (info.value.status(), info.value.message()) == ("400", message)
    assert "not_in_repo" not in {name for name, _, _ in index(server)}


def test_load_with_config_override(server: ServerProcess, grpc_client, http_client) -> None:
    try:
        # HTTP: parameters.config as a JSON string (Triton's form)
        body = {"parameters": {"config": json.dumps(add_sub_override(4, versions=[1]))}}
        assert post(server, "/v2/repository/models/add_sub/load", body).status_code == 200
        assert http_client.get_model_config("add_sub")["max_batch_size"] == 4
        assert grpc_client.is_model_ready("add_sub", "1") and not grpc_client.is_model_ready("add_sub", "2")
        assert grpc_client.get_model_metadata("add_sub").versions == ["1"]
        np.testing.assert_array_equal(add_sub_infer(grpc_client, batch=4), np.full((4, 16), 2.0, np.float32))
        with pytest.raises(InferenceServerException) as info:
            add_sub_infer(grpc_client, batch=5)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "<= 4" in info.value.message()

        # gRPC: parameters["config"].string_param
        grpc_client.load_model("add_sub", config=json.dumps(add_sub_override(2)))
        assert grpc_client.get_model_config("add_sub").config.max_batch_size == 2
        assert grpc_client.is_model_ready("add_sub", "2")  # default policy: latest 1

        # a load that fails leaves what was serving in place, and says so
        bad = json.dumps(add_sub_override(8, dims=15))
        with pytest.raises(InferenceServerException) as info:
            grpc_client.load_model("add_sub", config=bad)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "still serving" in info.value.message()
        assert grpc_client.get_model_config("add_sub").config.max_batch_size == 2
        np.testing.assert_array_equal(add_sub_infer(grpc_client, batch=2), np.full((2, 16), 2.0, np.float32))
    finally:
        # a load without override goes back to the repository's config.pbtxt
        http_client.load_model("add_sub")
    assert http_client.get_model_config("add_sub")["max_batch_size"] == 8
    assert grpc_client.is_model_ready("add_sub", "1") and grpc_client.is_model_ready("add_sub", "2")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", "invalid config override"),
        ('["a list"]', "must be a JSON object"),
        (json.dumps({**add_sub_override(4), "name": "other"}), "names model 'other'"),
        (json.dumps({"max_batch_size": "many"}), "invalid config override"),
        # issue 23: nesting that made json.loads raise RecursionError (a 500) is the client's mistake (400)
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "invalid config override: depth limit exceeded"),
        ("[" * 100_000 + "]" * 100_000, "invalid config override: depth limit exceeded"),
    ],
    ids=["not-json", "list", "other-name", "bad-field", "deep-object", "deep-list"],
)
def test_bad_config_override(server: ServerProcess, grpc_client, config: str, message: str) -> None:
    r = post(server, "/v2/repository/models/add_sub/load", {"parameters": {"config": config}})
    assert r.status_code == 400 and message in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model("add_sub", config=config)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and message in info.value.message()
    assert grpc_client.is_model_ready("add_sub")


def raw_post(server: ServerProcess, path: str) -> tuple[int, str]:
    """Sends ``path`` byte for byte (httpx would normalise '..' away before it reaches the server)."""
    conn = HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["..", "%2e%2e", "%2E%2E", "a%2Fb", "a/b", "..%2F..%2Fetc", ".hidden"])
@pytest.mark.parametrize("action", ["load", "unload"])
def test_path_traversal_names_rejected_over_http(server: ServerProcess, name: str, action: str) -> None:
    status, body = raw_post(server, f"/v2/repository/models/{name}/{action}")
    assert status == 400, (status, body)
    assert "invalid model name" in json.loads(body)["error"]
    assert raw_post(server, "/v2/health/ready")[0] in (200, 405)  # still serving


@pytest.mark.parametrize("name", ["..", "a/b", "%2e%2e", "../cifar10_resnet", "", ".", "a\\b"])
def test_path_traversal_names_rejected_over_grpc(grpc_client, name: str) -> None:
    for call in (grpc_client.load_model, grpc_client.unload_model):
        with pytest.raises(InferenceServerException) as info:
            call(name)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()
        assert "invalid model name" in info.value.message()
    assert grpc_client.is_server_live()


def test_explicit_load_picks_up_a_new_version_without_unloading(server: ServerProcess, repo: Path, grpc_client) -> None:
    """Triton needs unload + load for this (server#2853, #5757); here a load reloads in place."""
    staging = Path(tempfile.mkdtemp(prefix=".3.staging-", dir=repo / "add_sub"))
    (staging / "model.onnx").write_bytes(models.add_sub(16).SerializeToString())
    os.rename(staging, repo / "add_sub" / "3")
    try:
        assert not grpc_client.is_model_ready("add_sub", "3")  # explicit mode: nothing happens on its own
        grpc_client.load_model("add_sub")
        assert grpc_client.is_model_ready("add_sub", "3") and grpc_client.is_model_ready("add_sub", "1")
        assert grpc_client.get_model_metadata("add_sub").versions == ["1", "2", "3"]
        np.testing.assert_array_equal(add_sub_infer(grpc_client, version="3"), np.full((1, 16), 2.0, np.float32))

        # a corrupt version fails its load; the others keep serving and the index says why
        bad = Path(tempfile.mkdtemp(prefix=".4.staging-", dir=repo / "add_sub"))
        (bad / "model.onnx").write_bytes(b"corrupt")
        os.rename(bad, repo / "add_sub" / "4")
        r = post(server, "/v2/repository/models/add_sub/load")
        assert r.status_code == 400 and "version 4" in r.json()["error"], r.text
        rows = {r["version"]: r for r in post(server, "/v2/repository/index").json() if r["name"] == "add_sub"}
        assert rows["4"]["state"] == "UNAVAILABLE" and rows["4"]["reason"]
        assert all(rows[v]["state"] == "READY" for v in ("1", "2", "3"))
        np.testing.assert_array_equal(add_sub_infer(grpc_client), np.full((1, 16), 2.0, np.float32))
    finally:
        for v in ("3", "4"):
            path = repo / "add_sub" / v
            if path.exists():
                (path / "model.onnx").unlink()
                path.rmdir()
        post(server, "/v2/repository/models/add_sub/load")
    assert grpc_client.get_model_metadata("add_sub").versions == ["1", "2"]


def test_load_model_star_loads_everything(repo: Path, tmp_path: Path) -> None:
    s = start_server(repo, "--model-control-mode", "explicit", "--load-model", "*", log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(s.http_url)
        assert client.is_model_ready("add_sub") and client.is_model_ready("cifar10_resnet")
        client.close()
    finally:
        assert s.terminate() == 0
