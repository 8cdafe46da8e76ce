"""Triton's errors, exactly: every ``TritonError`` code a Python model answers with reaches tritonclient
with its message unchanged and Triton's HTTP status and gRPC code; a raising ``execute`` and a wrong
return value get Triton's ``Failed to process the request(s) ...`` texts (and the server log gets them
with the traceback); unknown models answer readiness, metadata, statistics and inference as Triton
does. Every expectation was observed on Triton 2.51 with the same model (tests/support/python_models).
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess


@pytest.fixture(scope="module")
def server(python_models_server: ServerProcess) -> ServerProcess:
    return python_models_server


#: the model's CODE input → (HTTP status, gRPC status, message)
CODES = {
    "UNKNOWN": ("400", "UNKNOWN", "error code: UNKNOWN"),
    "INTERNAL": ("500", "INTERNAL", "error code: INTERNAL"),
    "NOT_FOUND": ("404", "NOT_FOUND", "error code: NOT_FOUND"),
    "INVALID_ARG": ("400", "INVALID_ARGUMENT", "error code: INVALID_ARG"),
    "UNAVAILABLE": ("503", "UNAVAILABLE", "error code: UNAVAILABLE"),
    "UNSUPPORTED": ("501", "UNIMPLEMENTED", "error code: UNSUPPORTED"),
    "ALREADY_EXISTS": ("400", "ALREADY_EXISTS", "error code: ALREADY_EXISTS"),
    "CANCELLED": ("400", "CANCELLED", "error code: CANCELLED"),
    "(default)": ("500", "INTERNAL", "unrecognized error code: (default)"),  # TritonError's default code
}

PREFIX = "Failed to process the request(s) for model 'error_code_0', message: "
MISUSE = {
    "WRONG_COUNT": PREFIX + "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
    "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0\n",
    "NOT_A_LIST": PREFIX + "Expected a list in the execute return, found type '<class 'str'>'.",
    "BAD_ITEM": PREFIX
    + "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'str'>'.",
}


def _call(server: ServerProcess, protocol: str, code: str) -> InferenceServerException:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    t = module.InferInput("CODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([code.encode()], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer("error_code", [t])
    return info.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("code", list(CODES))
def test_every_triton_error_code(server: ServerProcess, protocol: str, code: str) -> None:
    http_status, grpc_status, message = CODES[code]
    error = _call(server, protocol, code)
    assert error.status() == (http_status if protocol == "http" else f"StatusCode.{grpc_status}")
    assert error.message() == message  # unchanged: no prefix added


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_exception_in_execute(server: ServerProcess, protocol: str) -> None:
    for code, exception in (
        ("RAISE", "ValueError: the model raised on purpose"),
        ("MODEL_EXCEPTION", "TritonModelException: a TritonModelException on purpose"),
    ):
        error = _call(server, protocol, code)
        assert error.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
        head, _, frames = error.message().partition("\n\nAt:\n")
        assert head == PREFIX + exception
        assert frames.endswith("/error_code/1/model.py(" + ("15" if code == "RAISE" else "17") + "): execute\n")
    assert "ValueError: the model raised on purpose\n\nAt:\n" in server.log()  # logged with the traceback


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("misuse", list(MISUSE))
def test_wrong_execute_return_values(server: ServerProcess, protocol: str, misuse: str) -> None:
    error = _call(server, protocol, misuse)
    assert error.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
    assert error.message() == MISUSE[misuse]


def test_backend_failures_are_counted(server: ServerProcess) -> None:
    def backend_failures() -> float:
        for line in httpx.get(server.metrics_url, timeout=10).text.splitlines():
            if line.startswith("nv_inference_request_failure{") and 'model="error_code"' in line and "BACKEND" in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = backend_failures()
    _call(server, "http", "RAISE")
    assert backend_failures() == before + 1


# ---- unknown models and versions: what Triton 2.51 answers -----------------------------------------


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        ("/v2/models/nope/ready", 400, {"error": "Model version not ready"}),
        ("/v2/models/error_code/versions/7/ready", 400, {"error": "Model version not ready"}),
        ("/v2/models/error_code/versions/x/ready", 404, {"error": "Not Found"}),
        ("/v2/models/nope", 404, {"error": "Request for unknown model: 'nope' is not found"}),
        ("/v2/models/nope/config", 404, {"error": "Request for unknown model: 'nope' is not found"}),
        (
            "/v2/models/error_code/versions/7",
            404,
            {"error": "Request for unknown model: 'error_code' version 7 is not found"},
        ),
        ("/v2/models/nope/stats", 400, {"error": "requested model 'nope' is not available"}),
        ("/v2/models/nope/versions/1/stats", 400, {"error": "requested model 'nope' is not available"}),
    ],
)
def test_http_answers_for_unknown_models(server: ServerProcess, path: str, status: int, body: object) -> None:
    r = httpx.get(server.base_url + path, timeout=10)
    assert (r.status_code, r.json()) == (status, body)


def test_http_inference_on_unknown_models(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "CODE", "shape": [1], "datatype": "BYTES", "data": ["OK"]}]}
    for path, message in (
        ("/v2/models/nope/infer", "Request for unknown model: 'nope' is not found"),
        ("/v2/models/error_code/versions/9/infer", "Request for unknown model: 'error_code' version 9 is not found"),
    ):
        r = httpx.post(server.base_url + path, json=body, timeout=10)
        assert (r.status_code, r.json()) == (404, {"error": message})
    assert httpx.get(server.base_url + "/v2/models/error_code/ready", timeout=10).status_code == 200


def test_grpc_answers_for_unknown_models(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("nope") is False
    assert client.is_model_ready("error_code", "7") is False
    for call in (lambda: client.get_model_metadata("nope"), lambda: client.get_model_config("nope")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert (info.value.status(), info.value.message()) == (
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'nope' is not found",
        )
    with pytest.raises(InferenceServerException) as stats:
        client.get_inference_statistics("nope")
    assert (stats.value.status(), stats.value.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "requested model 'nope' is not available",
    )
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready("nope") is False
