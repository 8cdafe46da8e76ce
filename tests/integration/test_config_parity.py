"""A served model's config is Triton's normalised config: the same configs, served by kubeinfer here and by
real Triton 2.51 when tests/support/config_parity/triton-2.51.json was recorded, answer the same bytes over
HTTP, the same message over gRPC and the same ``initialize`` args to Python models.

PyTorch and TensorRT models are left out here (a TorchScript file and a GPU would be needed to load them);
tests/unit/test_config_normalize.py checks their configs through the same normaliser and renderer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from onnx import TensorProto

from tests.support import config_parity, models
from tests.support.server import ServerProcess, start_server

RECORD = config_parity.record()["models"]
SERVED = [n for n in config_parity.names() if not n.startswith(("torch_", "trt_"))]
READY = [n for n in SERVED if RECORD[n]["state"] == "READY"]
REFUSED = [n for n in SERVED if RECORD[n]["state"] != "READY"]
STAND_IN = {"onnxruntime"}


def _onnx(model: str, _file: str) -> bytes:
    batched = json.loads(RECORD[model]["http"])["max_batch_size"] > 0
    dims: list[int | str] = ["N", 2] if batched else [2]
    return models.unary(model, "Identity", TensorProto.FLOAT, dims).SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("config_parity")
    repo = config_parity.write_repository(root / "repo", SERVED, _onnx)
    (root / "args").mkdir()
    server = start_server(
        repo,
        "--cache-config",
        "local,size=1048576",
        "--strict-readiness=false",
        log_dir=root,
        # no GPU, as on the machine Triton ran on: KIND_AUTO resolves to KIND_CPU
        env={"CUDA_VISIBLE_DEVICES": "", "CONFIG_PARITY_OUT": str(root / "args")},
    )
    yield server
    server.terminate()


def _expected_http(name: str) -> str:
    text: str = RECORD[name]["http"]
    if json.loads(text)["backend"] in STAND_IN:  # Triton served it with a Python-based stand-in
        text = text.replace('"runtime":"model.py"', '"runtime":""', 1)
    return text


@pytest.mark.parametrize("name", READY)
def test_http_config_is_tritons_text(
    server: ServerProcess, http_client: httpclient.InferenceServerClient, name: str
) -> None:
    expected = _expected_http(name)
    for path in (f"/v2/models/{name}/config", f"/v2/models/{name}/versions/1/config"):
        response = httpx.get(server.base_url + path, timeout=10)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.text == expected, path
    assert http_client.get_model_config(name) == json.loads(expected)


@pytest.mark.parametrize("name", READY)
def test_grpc_config_is_tritons_message(grpc_client: grpcclient.InferenceServerClient, name: str) -> None:
    got = json_format.MessageToDict(grpc_client.get_model_config(name).config, preserving_proto_field_name=True)
    expected: dict[str, Any] = dict(RECORD[name]["grpc"])
    if expected.get("backend") in STAND_IN:
        del expected["runtime"]
    assert got == expected


@pytest.mark.parametrize("name", [n for n in READY if json.loads(RECORD[n]["http"])["backend"] == "python"])
def test_python_models_initialize_with_tritons_args(server: ServerProcess, name: str) -> None:
    seen = {}
    for f in (Path(server.log_path).parent / "args").glob("*.json"):
        args = json.loads(f.read_text(encoding="utf-8"))
        if args["model_name"] == name:
            assert Path(args.pop("model_repository")).name == name
            seen[args["model_instance_name"]] = args
    assert seen == RECORD[name]["initialize"]


@pytest.mark.parametrize("name", REFUSED)
def test_groups_triton_refuses_fail_to_load_with_its_words(
    http_client: httpclient.InferenceServerClient, name: str
) -> None:
    (row,) = [r for r in http_client.get_model_repository_index() if r["name"] == name]
    assert row["state"] == "UNAVAILABLE"
    assert RECORD[name]["reason"].removeprefix("Invalid argument: ") in row["reason"]
