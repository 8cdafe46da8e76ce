"""Python models on a real server: an unchanged Triton model.py, auto-complete, BLS (sync and async)
through the callee's scheduler, and errors that stay with the request that caused them."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from tritonclient.utils import InferenceServerException

from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

# Triton's python_backend/examples/add_sub/model.py, verbatim in substance: nothing kubeinfer-specific
TRITON_ADD_SUB = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))
            inference_response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

TRITON_ADD_SUB_CONFIG = """
name: "py_add_sub"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

# Triton's auto_complete_config example shape: the config file names only the backend
AUTO_COMPLETE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "IN", "data_type": "TYPE_INT32", "dims": [3]}]
        outputs = [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [3]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for i in inputs:
            if i["name"] not in input_names:
                auto_complete_model_config.add_input(i)
        for o in outputs:
            if o["name"] not in output_names:
                auto_complete_model_config.add_output(o)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        outputs = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2 for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for out in outputs]
"""

# BLS: calls the ONNX add_sub model through the server (target and version from config parameters)
BLS_SYNC = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.target = params["target"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            bls = pb_utils.InferenceRequest(
                model_name=self.target,
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                requested_output_names=["OUTPUT0", "OUTPUT1"],
            )
            response = bls.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(response, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(response, "OUTPUT1"),
            ]))
        return responses
"""

# async BLS: version 1 and version 2 of add_sub called concurrently, OUTPUT0 from one, OUTPUT1 from the other
BLS_ASYNC = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            calls = [
                pb_utils.InferenceRequest(model_name="add_sub", model_version=v, inputs=inputs,
                                          requested_output_names=[name]).async_exec()
                for v, name in ((1, "OUTPUT0"), (2, "OUTPUT1"))
            ]
            first, second = await asyncio.gather(*calls)
            for r in (first, second):
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(second, "OUTPUT1"),
            ]))
        return responses
"""

BLS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
parameters {{ key: "target" value: {{ string_value: "{target}" }} }}
"""

# raises for a negative input: with one request per execute, only that request fails
RAISER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                raise ValueError(f"negative input {x.min()}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.sqrt(x))]))
        return responses
"""

# a per-request error response inside a batch: the other requests of the same execute call succeed
CHECKER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("X must be non-negative", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            n = np.full((x.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.sqrt(x)),
                                                         pb_utils.Tensor("REQUESTS", n)]))
        return responses
"""

SQRT_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }}
]
{extra}
"""

BROKEN_INIT = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot find weights.bin")

    def execute(self, requests):
        return []
"""


def _python_model(repo: Path, name: str, config: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python") / "repo"
    add_sub = """
        name: "add_sub"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        version_policy: { all { } }
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """
    write_model(repo, "add_sub", add_sub, {1: models.add_sub(16), 2: models.add_sub(16)})
    _python_model(repo, "py_add_sub", TRITON_ADD_SUB_CONFIG, TRITON_ADD_SUB)
    _python_model(repo, "auto", 'backend: "python"\n', AUTO_COMPLETE)
    _python_model(repo, "bls_sync", BLS_CONFIG.format(name="bls_sync", target="add_sub"), BLS_SYNC)
    _python_model(repo, "bls_missing", BLS_CONFIG.format(name="bls_missing", target="no_such_model"), BLS_SYNC)
    _python_model(repo, "bls_async", BLS_CONFIG.format(name="bls_async", target="add_sub"), BLS_ASYNC)
    _python_model(repo, "raiser", SQRT_CONFIG.format(name="raiser", extra=""), RAISER)
    # a lone request waits (an hour) for company: the three requests below leave together, however slow the machine
    batched = "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 3600000000 }"
    _python_model(repo, "checker", SQRT_CONFIG.format(name="checker", extra=batched), CHECKER)
    _python_model(repo, "broken", 'backend: "python"\n', BROKEN_INIT)
    server = start_server(repo, log_dir=repo.parent)
    yield server
    server.terminate()


def _client(server: ServerProcess, protocol: str):  # type: ignore[no-untyped-def]
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _inputs(module, **arrays: np.ndarray) -> list:  # type: ignore[no-untyped-def]
    result = []
    for name, array in arrays.items():
        inp = module.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT32")
        inp.set_data_from_numpy(array)
        result.append(inp)
    return result


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unchanged_triton_model_runs(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    result = client.infer("py_add_sub", _inputs(module, INPUT0=a, INPUT1=b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert client.is_model_ready("py_add_sub")


def test_auto_complete_config_fills_the_config(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("IN", "TYPE_INT32", [3])]
    assert [t["name"] for t in config["output"]] == ["OUT"]
    assert "dynamic_batching" in config
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    result = client.infer("auto", _inputs(httpclient, IN=x))
    np.testing.assert_array_equal(result.as_numpy("OUT"), 2 * x)


def _add_sub_count(client: httpclient.InferenceServerClient) -> int:
    stats = client.get_inference_statistics("add_sub")["model_stats"]
    return sum(s["inference_stats"]["success"]["count"] for s in stats)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_sync_calls_the_onnx_model_through_its_scheduler(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    stats_client = httpclient.InferenceServerClient(server.http_url)
    before = _add_sub_count(stats_client)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 16)).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    result = client.infer("bls_sync", _inputs(module, INPUT0=a, INPUT1=b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert _add_sub_count(stats_client) == before + 1


def test_bls_async_calls_two_versions_concurrently(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 16)).astype(np.float32), rng.standard_normal((2, 16)).astype(np.float32)
    v1 = [s["inference_count"] for s in client.get_inference_statistics("add_sub", "1")["model_stats"]][0]
    result = client.infer("bls_async", _inputs(httpclient, INPUT0=a, INPUT1=b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    after = [s["inference_count"] for s in client.get_inference_statistics("add_sub", "1")["model_stats"]][0]
    assert after == v1 + 2  # two rows went through version 1's scheduler


def test_bls_error_reaches_the_client(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.ones((1, 16), dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("bls_missing", _inputs(httpclient, INPUT0=a, INPUT1=a))
    assert info.value.status() == "500"
    assert "no_such_model" in info.value.message()
    assert client.is_server_live()


def test_an_exception_fails_only_the_request_that_raised(server: ServerProcess) -> None:
    values = [1.0, 4.0, -1.0, 9.0, -4.0, 16.0]

    def call(v: float) -> tuple[str, object]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            out = client.infer(
                "raiser",
                _inputs(httpclient, X=np.full((1, 4), v, dtype=np.float32)),
                outputs=[httpclient.InferRequestedOutput("Y")],
            )
            return "ok", out.as_numpy("Y")
        except InferenceServerException as exc:
            return exc.status() or "", exc.message()

    with ThreadPoolExecutor(len(values)) as pool:
        results = list(pool.map(call, values))
    for v, (status, payload) in zip(values, results, strict=True):
        if v < 0:
            assert status == "500"
            assert str(payload).startswith(
                "Failed to process the request(s) for model 'raiser_0', message: ValueError: negative input"
            )
        else:
            assert status == "ok", payload
            np.testing.assert_allclose(payload, np.sqrt(v))


def test_an_error_response_in_a_batch_fails_only_its_request(server: ServerProcess) -> None:
    """Three requests share one execute call (preferred batch 3); the bad one gets a 400, the others answers."""
    values = [4.0, -1.0, 9.0]

    def call(v: float) -> tuple[str, object]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            out = client.infer("checker", _inputs(httpclient, X=np.full((1, 4), v, dtype=np.float32)))
            return "ok", (out.as_numpy("Y"), out.as_numpy("REQUESTS"))
        except InferenceServerException as exc:
            return exc.status() or "", exc.message()

    with ThreadPoolExecutor(len(values)) as pool:
        results = list(pool.map(call, values))
    for v, (status, payload) in zip(values, results, strict=True):
        if v < 0:
            assert status == "400"
            assert "X must be non-negative" in str(payload)
        else:
            assert status == "ok", payload
            y, requests = payload  # type: ignore[misc]
            np.testing.assert_allclose(y, np.sqrt(v))
            assert requests[0, 0] == 3  # executed together with the failing request


def test_a_model_whose_initialize_raises_is_unavailable_with_the_reason(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    rows = {r["name"]: r for r in client.get_model_repository_index()}
    assert rows["broken"]["state"] == "UNAVAILABLE"
    assert "initialize failed: RuntimeError: cannot find weights.bin" in rows["broken"]["reason"]
    assert not client.is_model_ready("broken")
    assert client.is_model_ready("py_add_sub")
