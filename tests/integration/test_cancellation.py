"""Cancellation reaches Python models: a gRPC cancel, a closed HTTP connection and a stream cancel mark
the request cancelled (``request.is_cancelled()`` / ``sender.is_cancelled()``); a request cancelled while
it waits in the queue never executes; the statistics and ``nv_inference_request_failure{reason="CANCELED"}``
count cancelled requests.

Observed through the models' own log lines and the server's counters, never through sleeps.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, grpc_transports
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def server(python_models_server: ServerProcess) -> ServerProcess:
    return python_models_server


def _seconds(value: float) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("SECONDS", [1], "FP32")
    t.set_data_from_numpy(np.array([value], np.float32))
    return [t]


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    for line in httpx.get(server.metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _stats(server: ServerProcess) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    return dict(client.get_inference_statistics("cancellable")["model_stats"][0])


def _logged(server: ServerProcess, text: str) -> bool:
    return text in server.log()


def test_grpc_cancel_reaches_the_running_model_and_queued_requests_never_run(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    running, queued = f"run-{uuid.uuid4().hex[:8]}", f"queued-{uuid.uuid4().hex[:8]}"
    canceled_before = _metric(server, "nv_inference_request_failure", model="cancellable", reason="CANCELED")
    stats_before = _stats(server)
    first = client.async_infer("cancellable", _seconds(60), lambda result, error: None, request_id=running)
    wait_for("the first request to run", lambda: _logged(server, f"cancellable: request {running} started"))
    second = client.async_infer("cancellable", _seconds(0.1), lambda result, error: None, request_id=queued)
    wait_for(
        "the second request to queue behind the first (one instance)",
        lambda: _metric(server, "nv_inference_pending_request_count", model="cancellable") == 1,
    )
    second.cancel()
    wait_for(
        "the queued request to be counted as cancelled",
        lambda: (
            _metric(server, "nv_inference_request_failure", model="cancellable", reason="CANCELED")
            == canceled_before + 1
        ),
    )
    first.cancel()
    wait_for(
        "the running model to see is_cancelled()", lambda: _logged(server, f"cancellable: request {running} cancelled")
    )
    wait_for(
        "both requests to count as cancelled failures",
        lambda: (
            _metric(server, "nv_inference_request_failure", model="cancellable", reason="CANCELED")
            == canceled_before + 2
        ),
    )
    assert not _logged(server, f"request {queued} started")  # the cancelled queued request never executed
    after = _stats(server)
    assert after["inference_stats"]["fail"]["count"] == stats_before["inference_stats"]["fail"]["count"] + 2
    assert after["execution_count"] == stats_before["execution_count"]  # no successful execution was added
    client.close()


def test_a_closed_http_connection_cancels_the_request(server: ServerProcess) -> None:
    request_id = f"http-{uuid.uuid4().hex[:8]}"
    body = json.dumps(
        {"id": request_id, "inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [60]}]}
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        head = (
            "POST /v2/models/cancellable/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        wait_for("the request to run", lambda: _logged(server, f"cancellable: request {request_id} started"))
    wait_for("the model to see the closed connection", lambda: _logged(server, f"request {request_id} cancelled"))


@pytest.mark.parametrize("transport", grpc_transports())
def test_stream_cancel_reaches_a_decoupled_model(
    transport: str, python_models_server_on: Callable[[str], ServerProcess]
) -> None:
    server = python_models_server_on(transport)
    request_id = f"stream-{uuid.uuid4().hex[:8]}"
    received: list[Any] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: received.append((result, error)))
    inputs = []
    for name, values, datatype, dtype in (
        ("IN", list(range(100)), "INT32", np.int32),
        ("DELAY", [50] * 100, "UINT32", np.uint32),
        ("WAIT", [0], "UINT32", np.uint32),
    ):
        t = grpcclient.InferInput(name, [len(values)], datatype)
        t.set_data_from_numpy(np.array(values, dtype))
        inputs.append(t)
    client.async_stream_infer("repeat_int32", inputs, request_id=request_id)
    wait_for("a few responses", lambda: len(received) >= 3)
    client.stop_stream(cancel_requests=True)
    wait_for(
        "the model to see sender.is_cancelled()",
        lambda: _logged(server, f"repeat_int32: request {request_id} cancelled after"),
    )
    assert all(error is None for _, error in received[:3])
    client.close()
