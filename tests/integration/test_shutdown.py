"""Graceful shutdown: on SIGTERM readiness drops at once, new requests get 503 / UNAVAILABLE, the 16
requests already in flight or queued finish, and the process exits 0 (bounded by --shutdown-timeout).

The model is deliberately slow (a chain of MatMuls by the identity, one CPU instance, one thread), so
16 batch-8 requests queue up for seconds; its output equals its input, so every answer is checkable.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

SIZE = 256
CONFIG = f"""
name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {SIZE}, {SIZE} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {SIZE}, {SIZE} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""
IN_FLIGHT = 16


def slow_identity(depth: int = 32) -> onnx.ModelProto:
    """OUTPUT = INPUT @ I @ I ... (``depth`` MatMuls): exact, and about 0.2 s per batch of 8 on one core."""
    nodes, prev = [], "INPUT"
    for i in range(depth):
        out = "OUTPUT" if i == depth - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, "eye"], [out]))
        prev = out
    shape = ["batch", SIZE, SIZE]
    graph = helper.make_graph(
        nodes,
        "slow_identity",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(np.eye(SIZE, dtype=np.float32), "eye")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("shutdown") / "repo"
    write_model(repo, "slow", CONFIG, {1: slow_identity()})
    return repo


@dataclass
class Requests:
    """``IN_FLIGHT`` batch-8 requests, half over HTTP and half over gRPC, each on its own thread."""

    server: ServerProcess
    results: dict[int, str] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def one(self, i: int) -> None:
        module = httpclient if i % 2 else grpcclient
        url = self.server.http_url if i % 2 else self.server.grpc_url
        data = np.full((8, SIZE, SIZE), float(i), np.float32)
        try:
            if module is httpclient:
                client, call = module.InferenceServerClient(url, network_timeout=300.0), {}
            else:
                client, call = module.InferenceServerClient(url), {"client_timeout": 300}
            inp = module.InferInput("INPUT", list(data.shape), "FP32")
            inp.set_data_from_numpy(data)
            out = client.infer("slow", [inp], **call).as_numpy("OUTPUT")
            self.results[i] = "ok" if np.array_equal(out, data) else "wrong output"
            client.close()
        except Exception as exc:  # noqa: BLE001 - recorded and asserted on
            self.results[i] = f"error: {exc}"

    def start(self) -> None:
        for i in range(IN_FLIGHT):
            t = threading.Thread(target=self.one, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def join(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a client is still waiting: the server hung"


def pending(server: ServerProcess) -> int:
    text = httpx.get(server.metrics_url, timeout=10).text
    match = re.search(r'^nv_inference_pending_request_count\{[^}]*model="slow"[^}]*\} (\d+)', text, re.M)
    return int(match.group(1)) if match else 0


def wait_all_arrived(server: ServerProcess, requests: Requests) -> None:
    """All 16 are on the server: queued (pending) + finished + at most one executing."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if pending(server) + len(requests.results) >= IN_FLIGHT - 1:
            return
        time.sleep(0.02)
    raise AssertionError(f"the requests never queued up:\n{server.log()[-3000:]}")


def small_request(module: object) -> list:
    inp = module.InferInput("INPUT", [1, SIZE, SIZE], "FP32")
    inp.set_data_from_numpy(np.zeros((1, SIZE, SIZE), np.float32))
    return [inp]


def test_sigterm_finishes_in_flight_requests(repo: Path, tmp_path: Path) -> None:
    server = start_server(repo, "--shutdown-timeout", "120", log_dir=tmp_path)
    requests = Requests(server)
    try:
        requests.start()
        wait_all_arrived(server, requests)
        server.proc.send_signal(signal.SIGTERM)

        # readiness is false at once, while the queue is still draining
        deadline = time.monotonic() + 10
        while httpx.get(f"{server.base_url}/v2/health/ready", timeout=10).status_code != 503:
            assert time.monotonic() < deadline, "readiness did not turn false after SIGTERM"
            time.sleep(0.01)
        assert len(requests.results) < IN_FLIGHT, "everything finished before readiness dropped"
        assert httpx.get(f"{server.base_url}/v2/health/live", timeout=10).status_code == 200

        # new requests are refused while draining: HTTP 503, gRPC UNAVAILABLE
        http = httpclient.InferenceServerClient(server.http_url)
        with pytest.raises(InferenceServerException) as info:
            http.infer("slow", small_request(httpclient))
        assert info.value.status() == "503" and "shutting down" in info.value.message()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            grpc.infer("slow", small_request(grpcclient))
        assert info.value.status() == "StatusCode.UNAVAILABLE" and "shutting down" in info.value.message()
        assert not grpc.is_server_ready()
        assert len(requests.results) < IN_FLIGHT, "the refusals were not checked during the drain"

        requests.join()
        code = server.proc.wait(120)
    finally:
        server.terminate(30)
    assert requests.results == {i: "ok" for i in range(IN_FLIGHT)}, f"{requests.results}\n{server.log()[-3000:]}"
    assert code == 0

    # after exit nothing listens any more
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.base_url}/v2/health/live", timeout=5)
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer("slow", small_request(grpcclient), client_timeout=10)
    assert info.value.status() == "StatusCode.UNAVAILABLE"


def test_shutdown_timeout_bounds_the_drain(repo: Path, tmp_path: Path) -> None:
    """Past --shutdown-timeout the rest of the queue is refused (503 / UNAVAILABLE), not left hanging; exit 0.

    16 queued batches take several seconds here; the bound is 0.5 s, so part of the queue is cut.
    """
    server = start_server(repo, "--shutdown-timeout", "0.5", log_dir=tmp_path)
    requests = Requests(server)
    try:
        requests.start()
        wait_all_arrived(server, requests)
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(120)
        requests.join()
    finally:
        server.terminate(30)
    assert code == 0
    outcomes = list(requests.results.values())
    assert len(outcomes) == IN_FLIGHT
    assert any(o != "ok" for o in outcomes), "the whole queue drained: the timeout bounded nothing"
    refused = ("error: [503] server is shutting down", "error: [StatusCode.UNAVAILABLE] server is shutting down")
    assert all(o == "ok" or o.startswith(refused) for o in outcomes), outcomes
