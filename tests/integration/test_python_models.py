"""Python models beyond one file and one response: sibling imports with per-instance isolation,
``initialize`` args as Triton fills them, custom metrics on ``/metrics`` (gone when the model unloads),
and decoupled BLS. Expected values were observed on Triton 2.51 with the same models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.repos import copy_python_models
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def server(python_models_server: ServerProcess) -> ServerProcess:
    return python_models_server


def _int_input(name: str, values: list[int]) -> httpclient.InferInput:
    t = httpclient.InferInput(name, [len(values)], "INT32")
    t.set_data_from_numpy(np.array(values, np.int32))
    return t


def _text(value: str, name: str = "MODE") -> httpclient.InferInput:
    t = httpclient.InferInput(name, [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return t


# ---- models that span files -----------------------------------------------------------------------


def test_a_model_spanning_files_imports_siblings_with_each_instance_isolated(server: ServerProcess) -> None:
    def call(x: int) -> tuple[int, dict[str, Any]]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        result = client.infer("multi_file", [_int_input("IN", [x])])
        return int(result.as_numpy("OUT")[0]), json.loads(result.as_numpy("INFO")[0])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(12)))
    # helper.add_offset (import helper), then helpers.ops.scale (a sibling package)
    assert [out for out, _ in results] == [(x + 1000) * 2 for x in range(12)]
    infos = [info for _, info in results]
    assert {i["shared"] for i in infos} == {"shared-from-model-folder"}  # a module in the model folder
    assert all(i["same_helper"] for i in infos)  # importing again inside execute: the instance's module
    assert all(Path(i["model_dir"]).parts[-2:] == ("multi_file", "1") for i in infos)
    by_instance: dict[str, list[dict[str, Any]]] = {}
    for info in infos:
        by_instance.setdefault(info["instance"], []).append(info)
    assert set(by_instance) <= {"multi_file_0_0", "multi_file_0_1"}
    for calls in by_instance.values():
        # module state is per instance: each instance counts only its own calls, with no gaps
        assert sorted(i["relative_calls"] for i in calls) == list(range(1, len(calls) + 1))
        assert sorted(i["helper_calls"] for i in calls) == list(range(len(calls)))


def test_initialize_args_are_tritons(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    args = json.loads(client.infer("init_args", [_int_input("IN", [1])]).as_numpy("ARGS")[0])
    assert args["model_name"] == "init_args"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] in ("init_args_0_0", "init_args_0_1")
    assert Path(args["model_repository"]).name == "init_args"
    # the config exactly as Triton 2.51 hands it over (compact JSON, proto field order, its defaults)
    expected = (
        '{"name":"init_args","platform":"","backend":"python","runtime":"","version_policy":{"latest":'
        '{"num_versions":1}},"max_batch_size":0,"input":[{"name":"IN","data_type":"TYPE_INT32","format":'
        '"FORMAT_NONE","dims":[1],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,'
        '"is_non_linear_format_io":false}],"output":[{"name":"ARGS","data_type":"TYPE_STRING","dims":[1],'
        '"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false}],"batch_input":[],'
        '"batch_output":[],"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
        '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
        '"instance_group":[{"name":"init_args_0","kind":"KIND_CPU","count":2,"gpus":[],"secondary_devices":[],'
        '"profile":[],"passive":false,"host_policy":""}],"default_model_filename":"model.py",'
        '"cc_model_filenames":{},"metric_tags":{},"parameters":{"greeting":{"string_value":"hello"}},'
        '"model_warmup":[]}'
    )
    assert args["model_config"] == expected


# ---- custom metrics -----------------------------------------------------------------------------------


def _custom_samples(server: ServerProcess) -> dict[str, dict[str, float]]:
    families = text_string_to_metric_families(httpx.get(server.metrics_url, timeout=10).text)
    out: dict[str, dict[str, float]] = {}
    for family in families:
        if family.name not in ("requests_seen", "requests_seen_total", "last_input_value", "input_values"):
            continue
        for s in family.samples:
            key = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out.setdefault(s.name, {})[key] = s.value
    return out


def test_custom_metrics_are_scraped_beside_ours(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    counts = []
    for value in (0.5, 5.0, 50.0):
        t = httpclient.InferInput("IN", [1], "FP32")
        t.set_data_from_numpy(np.array([value], np.float32))
        result = client.infer("custom_metrics", [t])
        counts.append(float(result.as_numpy("COUNT")[0]))
        refusals = [r.decode() for r in result.as_numpy("REFUSALS")]
    assert counts == [1.0, 2.0, 3.0]
    prefix = "Failed to process the request for model 'custom_metrics_0', message: TRITONSERVER_METRIC_KIND_COUNTER "
    assert refusals == [
        "Failed to increment metric value: " + prefix + "can only be incremented monotonically by non-negative values.",
        "Failed to set metric value: " + prefix + "does not support Set",
    ]
    labels = "model=custom_metrics,version=1"
    samples = _custom_samples(server)
    assert samples["requests_seen_total"] == {labels: 3.0}
    assert samples["last_input_value"] == {labels: 50.0}
    assert samples["input_values_count"] == {labels: 3.0}
    assert samples["input_values_sum"] == {labels: 55.5}
    assert samples["input_values_bucket"] == {  # bucket bounds written as Triton writes them
        f"le=1,{labels}": 1.0,
        f"le=10,{labels}": 2.0,
        f"le=100,{labels}": 3.0,
        f"le=+Inf,{labels}": 3.0,
    }
    text = httpx.get(server.metrics_url, timeout=10).text
    assert "# TYPE requests_seen_total counter" in text  # named as the model chose (Triton adds no suffix)
    assert "# HELP last_input_value The last input value" in text


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("explicit")
    repo = copy_python_models(root / "repo", "custom_metrics")
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "custom_metrics", log_dir=root)
    yield server
    server.terminate()


def test_custom_metrics_leave_with_their_model(explicit_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    t = httpclient.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.array([2.0], np.float32))
    client.infer("custom_metrics", [t])
    assert _custom_samples(explicit_server)["requests_seen_total"] == {"model=custom_metrics,version=1": 1.0}
    client.unload_model("custom_metrics")
    wait_for("the model's metric families to leave /metrics", lambda: not _custom_samples(explicit_server))
    client.load_model("custom_metrics")
    client.infer("custom_metrics", [t])
    assert _custom_samples(explicit_server)["requests_seen_total"] == {"model=custom_metrics,version=1": 1.0}


# ---- decoupled BLS ------------------------------------------------------------------------------------


def _bls(server: ServerProcess, mode: str) -> Any:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    return json.loads(client.infer("bls_decoupled", [_text(mode)]).as_numpy("OUT")[0])


def test_decoupled_bls_iterates_the_responses_with_the_empty_final(server: ServerProcess) -> None:
    assert _bls(server, "SYNC") == [{"IDX": [0], "OUT": [1]}, {"IDX": [1], "OUT": [2]}, {"IDX": [2], "OUT": [3]}, {}]
    assert _bls(server, "ASYNC") == [{"IDX": [0], "OUT": [4]}, {"IDX": [1], "OUT": [5]}, {}]
    assert _bls(server, "ASYNC_TWO") == [
        [{"IDX": [0], "OUT": [1]}, {}],
        [{"IDX": [0], "OUT": [2]}, {"IDX": [1], "OUT": [3]}, {}],
    ]


def test_bls_options(server: ServerProcess) -> None:
    assert _bls(server, "REQUESTED") == [{"IDX": [0]}, {}]  # requested_output_names
    assert _bls(server, "BYTES_NAME") == [{"IDX": [0], "OUT": [6]}, {}]  # model_name given as bytes
    assert _bls(server, "DECOUPLED_CALL_TO_PLAIN") == [{"OUT": [3]}]
    params = _bls(server, "PARAMS")
    assert json.loads(params["PARAMS"][0]) == {"a": 1, "b": "two", "c": True}
    assert json.loads(params["REQUESTED"][0]) == ["PARAMS", "REQUESTED"]


def test_bls_errors_are_tritons(server: ServerProcess) -> None:
    assert _bls(server, "NON_DECOUPLED_CALL") == {
        "code": 1,
        "error": "Model repeat_int32 - Error when running inference: Model repeat_int32 is using the decoupled. "
        "The current BLS request call doesn't support models using the decoupled transaction policy. Please use "
        "'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled models.'",
    }
    not_ready = (
        "Model no_such_model - Error when running inference: Failed for execute the inference request. Model "
        "'no_such_model' is not ready."
    )
    assert _bls(server, "UNKNOWN_MODEL") == [{"code": 1, "error": not_ready}]
    assert _bls(server, "UNKNOWN_MODEL_PLAIN") == {"code": 1, "error": not_ready}
    # a callee's own error keeps its message (and, as newer Triton versions do, its code)
    plain, streamed = _bls(server, "CALLEE_NOT_FOUND")
    assert plain == {"code": 2, "error": "error code: NOT_FOUND"} and streamed == [plain]
    raised, _ = _bls(server, "CALLEE_RAISE")
    assert raised["error"].startswith(
        "Failed to process the request(s) for model 'error_code_0', message: ValueError: the model raised on purpose"
    )
