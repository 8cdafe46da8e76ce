"""Trace and logging extensions with tritonclient over HTTP and gRPC, and Triton's JSON trace file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""
TIMESTAMPS = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, trace_dir: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("trace") / "repo"
    model = test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])
    for name in ("add", "other", "late"):
        write_model(repo, name, CONFIG.format(name=name), {1: model})
    server = start_server(
        repo,
        "--model-control-mode=explicit",
        "--load-model=add",
        "--load-model=other",
        f"--trace-config=triton,file={trace_dir / 'trace.json'}",
        "--trace-config=triton,log-frequency=2",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
    )
    yield server
    server.terminate()


def _infer(client: Any, model: str = "add", value: float = 1.0) -> None:
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    a = np.full((1, 4), value, dtype=np.float32)
    inputs = [mod.InferInput("A", [1, 4], "FP32"), mod.InferInput("B", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    client.infer(model, inputs, request_id=f"req-{value}")


def _grpc_settings(response: Any) -> dict[str, list[str]]:
    return {k: list(v.value) for k, v in response.settings.items()}


def test_trace_settings_read_with_both_clients(server: ServerProcess, trace_dir: Path) -> None:
    expected = {
        "trace_file": str(trace_dir / "trace.json"),
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "2",
        "trace_mode": "triton",
    }
    assert httpclient.InferenceServerClient(server.http_url).get_trace_settings() == expected
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert _grpc_settings(grpc.get_trace_settings()) == {
        k: v if isinstance(v, list) else [v] for k, v in expected.items()
    }
    meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    assert {"trace", "logging", "sequence"} <= set(meta["extensions"])


def test_traced_requests_are_written_as_triton_json_every_log_frequency(server: ServerProcess, trace_dir: Path) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for i, client in enumerate([http, grpc, http, grpc]):
        _infer(client, value=float(i))
    wait_for("two trace files (log_frequency 2)", lambda: (trace_dir / "trace.json.1").exists())
    records = json.loads((trace_dir / "trace.json.0").read_text())
    heads = [r for r in records if "model_name" in r]
    assert [(h["model_name"], h["model_version"], h["request_id"]) for h in heads] == [
        ("add", 1, "req-0.0"),
        ("add", 1, "req-1.0"),
    ]
    for head in heads:
        stamps = [r["timestamps"][0] for r in records if r["id"] == head["id"] and "timestamps" in r]
        assert [s["name"] for s in stamps] == TIMESTAMPS
        assert [s["ns"] for s in stamps] == sorted(s["ns"] for s in stamps)


def test_model_override_clear_and_count(server: ServerProcess, trace_dir: Path) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    # the first update for a model copies the global settings it does not name
    settings = http.update_trace_settings(model_name="other", settings={"trace_level": ["TENSORS"], "trace_count": "1"})
    assert settings["trace_level"] == ["TENSORS"] and settings["trace_rate"] == "1" and settings["trace_count"] == "1"
    assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]  # global unchanged
    _infer(http, "other", 5.0)
    # trace_count reached 0: the trace is written at once, indexed, and tracing stops
    assert http.get_trace_settings(model_name="other")["trace_count"] == "0"
    # the model's settings share the global trace file: the next index, nothing overwritten
    records = json.loads((trace_dir / "trace.json.2").read_text())
    assert [r["model_name"] for r in records if "model_name" in r] == ["other"]
    tensors = [r for r in records if r.get("activity")]
    assert {(r["activity"], r["tensor"]["name"]) for r in tensors} >= {
        ("TENSOR_QUEUE_INPUT", "A"),
        ("TENSOR_BACKEND_OUTPUT", "OUT"),
    }
    out = next(r for r in tensors if r["activity"] == "TENSOR_BACKEND_OUTPUT")
    assert out["tensor"] == {"name": "OUT", "data": "10.0,10.0,10.0,10.0", "shape": "1,4", "dtype": "FP32"}
    # clearing a model setting (gRPC: no value; HTTP: null) falls back to the global value
    cleared = _grpc_settings(grpc.update_trace_settings(model_name="other", settings={"trace_level": None}))
    assert cleared["trace_level"] == ["TIMESTAMPS"]
    r = httpx.post(f"{server.base_url}/v2/models/other/trace/setting", json={"trace_count": None})
    assert r.json()["trace_count"] == "-1"


def test_trace_setting_errors(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(
        InferenceServerException, match="trace file location can not be updated through network protocol"
    ):
        http.update_trace_settings(settings={"trace_file": "/etc/evil"})
    assert httpx.post(f"{server.base_url}/v2/trace/setting", json={"trace_file": "/x"}).status_code == 501
    with pytest.raises(InferenceServerException, match="trace_level"):
        http.update_trace_settings(settings={"trace_level": ["LOUD"]})
    with pytest.raises(InferenceServerException, match="'trace_rate' must be at least 1"):
        grpcclient.InferenceServerClient(server.grpc_url).update_trace_settings(settings={"trace_rate": "0"})
    r = httpx.get(f"{server.base_url}/v2/models/nope/trace/setting")
    assert r.status_code == 404


def test_log_settings_change_what_is_logged(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    expected = {
        "log_file": "",
        "log_info": True,
        "log_warning": True,  # Triton 2.51's spelling (its protocol document says log_warnings)
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    assert http.get_log_settings() == expected
    response = grpc.get_log_settings(as_json=True)
    assert response["settings"]["log_info"] == {"bool_param": True}
    # INFO off: the next model load is not logged
    assert http.update_log_settings({"log_info": False}) == {**expected, "log_info": False}
    http.load_model("late")
    http.unload_model("late")
    assert "loaded late version 1" not in server.log()
    # back on over gRPC, verbose too: the next load is logged (and DEBUG lines appear)
    updated = grpc.update_log_settings({"log_info": True, "log_verbose_level": 1}, as_json=True)
    assert updated["settings"]["log_verbose_level"] == {"uint32_param": 1}
    http.load_model("late")
    wait_for("the load to be logged", lambda: "loaded late version 1" in server.log())
    http.update_log_settings({"log_verbose_level": 0, "log_format": "ISO8601"})
    for client in (http, grpc):  # Triton's words: no log_file through the API, not even the current one
        with pytest.raises(InferenceServerException, match="log file location can not be updated through network"):
            client.update_log_settings({"log_file": "/tmp/elsewhere.log"})
        with pytest.raises(InferenceServerException, match="log file location can not be updated through network"):
            client.update_log_settings({"log_file": ""})
    with pytest.raises(InferenceServerException, match="expecting a boolean value for log setting 'log_error'"):
        http.update_log_settings({"log_errors": "yes"})  # the protocol document's spelling is accepted too


def test_streamed_requests_are_traced_into_the_file_too(tmp_path: Path) -> None:
    """A gRPC stream's requests and an HTTP generate_stream request: Triton's records, written when trace_count
    runs out."""
    repo = tmp_path / "repo"
    write_model(
        repo, "add", CONFIG.format(name="add"), {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])}
    )
    trace_file = tmp_path / "trace.json"
    server = start_server(
        repo,
        f"--trace-config=triton,file={trace_file}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=level=TENSORS",
        "--trace-config=rate=1",
        "--trace-config=count=3",
    )
    try:
        results: list[tuple[Any, Any]] = []
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        grpc.start_stream(callback=lambda result, error: results.append((result, error)))
        for value in (1.0, 2.0):
            a = np.full((1, 4), value, dtype=np.float32)
            inputs = [grpcclient.InferInput("A", [1, 4], "FP32"), grpcclient.InferInput("B", [1, 4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a)
            grpc.async_stream_infer("add", inputs, request_id=f"stream-{value}")
        grpc.stop_stream()
        assert len(results) == 2 and all(error is None for _, error in results), results
        answer = httpx.post(
            f"{server.base_url}/v2/models/add/generate_stream", json={"A": [3] * 4, "B": [3] * 4, "id": "gen"}
        )
        assert answer.status_code == 200, answer.text
        wait_for("the trace file (trace_count ran out)", lambda: (trace_file.parent / "trace.json.0").exists())
        records = json.loads((trace_file.parent / "trace.json.0").read_text())
    finally:
        server.terminate()
    heads = [r for r in records if "model_name" in r]
    assert sorted((h["model_name"], h["model_version"], h["request_id"]) for h in heads) == [
        ("add", 1, "gen"),
        ("add", 1, "stream-1.0"),
        ("add", 1, "stream-2.0"),
    ]
    for head in heads:
        stamps = [r["timestamps"][0] for r in records if r["id"] == head["id"] and "timestamps" in r]
        assert [s["name"] for s in stamps] == TIMESTAMPS
        assert [s["ns"] for s in stamps] == sorted(s["ns"] for s in stamps)
        outputs = [
            r["tensor"] for r in records if r["id"] == head["id"] and r.get("activity") == "TENSOR_BACKEND_OUTPUT"
        ]
        assert [o["name"] for o in outputs] == ["OUT"]
    gen = next(h for h in heads if h["request_id"] == "gen")
    out = next(r for r in records if r["id"] == gen["id"] and r.get("activity") == "TENSOR_BACKEND_OUTPUT")
    assert out["tensor"]["data"] == "6.0,6.0,6.0,6.0"
