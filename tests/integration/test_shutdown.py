"""Graceful shutdown: on SIGTERM readiness drops at once, new requests get 503 / UNAVAILABLE, the 16
requests already in flight or queued finish, and the process exits 0 (bounded by --shutdown-timeout).

The first request is held at a gate (the ``sleep`` test backend) on the model's only instance and the
other 15 queue behind it, so the drain is still going on, for certain, until the test opens the gate;
the model echoes its input, so every answer is checkable.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import Gate, require_sleep_backend, wait_pending, write_sleep_model
from tests.support.waiting import wait_for

MODEL = "drained"
IN_FLIGHT = 16
REFUSED = ("error: [503] server is shutting down", "error: [StatusCode.UNAVAILABLE] server is shutting down")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("shutdown") / "repo"
    write_sleep_model(repo, MODEL, 0, "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n")
    return repo


@dataclass
class Requests:
    """``IN_FLIGHT`` batch-8 requests, half over HTTP and half over gRPC, each on its own thread; the first
    one is held at ``gate`` while executing, the others queue behind it."""

    server: ServerProcess
    gate: Gate
    results: dict[int, str] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def one(self, i: int) -> None:
        module = httpclient if i % 2 else grpcclient
        url = self.server.http_url if i % 2 else self.server.grpc_url
        data = np.full((8, 4), float(i), np.float32)
        params = self.gate.params if i == 0 else None
        try:
            if module is httpclient:
                client, call = module.InferenceServerClient(url, network_timeout=300.0), {}
            else:
                client, call = module.InferenceServerClient(url), {"client_timeout": 300}
            inp = module.InferInput("INPUT0", list(data.shape), "FP32")
            inp.set_data_from_numpy(data)
            out = client.infer(MODEL, [inp], parameters=params, **call).as_numpy("OUTPUT0")
            self.results[i] = "ok" if np.array_equal(out, data) else "wrong output"
            client.close()
        except Exception as exc:  # recorded and asserted on
            self.results[i] = f"error: {exc}"

    def start(self) -> None:
        """Returns once the first request executes (held) and the other 15 are queued."""
        for i in range(IN_FLIGHT):
            t = threading.Thread(target=self.one, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)
            if i == 0:
                self.gate.wait_entered()
        wait_pending(self.server.metrics_url, MODEL, IN_FLIGHT - 1)

    def join(self, timeout: float = 300) -> None:
        for t in self.threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a client is still waiting: the server hung"


def small_request(module: object) -> list:
    inp = module.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    return [inp]


def test_sigterm_finishes_in_flight_requests(repo: Path, tmp_path: Path) -> None:
    server = start_server(repo, "--shutdown-timeout", "120", log_dir=tmp_path)
    try:
        with Gate(tmp_path) as gate:
            requests = Requests(server, gate)
            requests.start()
            server.proc.send_signal(signal.SIGTERM)

            # readiness turns false while the whole queue still waits behind the held request
            ready_url = f"{server.base_url}/v2/health/ready"
            wait_for("readiness false after SIGTERM", lambda: httpx.get(ready_url, timeout=10).status_code == 503)
            assert httpx.get(f"{server.base_url}/v2/health/live", timeout=10).status_code == 200

            # new requests are refused while draining: HTTP 503, gRPC UNAVAILABLE
            http = httpclient.InferenceServerClient(server.http_url)
            with pytest.raises(InferenceServerException) as info:
                http.infer(MODEL, small_request(httpclient))
            assert info.value.status() == "503" and "shutting down" in info.value.message()
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            with pytest.raises(InferenceServerException) as info:
                grpc.infer(MODEL, small_request(grpcclient))
            assert info.value.status() == "StatusCode.UNAVAILABLE" and "shutting down" in info.value.message()
            assert not grpc.is_server_ready()
            assert requests.results == {}, "a request finished while the first one was held"

            gate.open()
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
        grpcclient.InferenceServerClient(server.grpc_url).infer(MODEL, small_request(grpcclient), client_timeout=10)
    assert info.value.status() == "StatusCode.UNAVAILABLE"


def test_shutdown_timeout_bounds_the_drain(repo: Path, tmp_path: Path) -> None:
    """Past --shutdown-timeout (0.5 s) every request still queued or executing is refused (503 / UNAVAILABLE),
    not left hanging; once the held execution ends the process exits 0."""
    server = start_server(repo, "--shutdown-timeout", "0.5", log_dir=tmp_path)
    try:
        with Gate(tmp_path) as gate:
            requests = Requests(server, gate)
            requests.start()
            server.proc.send_signal(signal.SIGTERM)
            wait_for(
                "every request answered past the shutdown timeout",
                lambda: len(requests.results) == IN_FLIGHT,
                describe=lambda: requests.results,
            )
            gate.open()
            code = server.proc.wait(120)
            requests.join()
    finally:
        server.terminate(30)
    assert code == 0
    outcomes = list(requests.results.values())
    assert all(o.startswith(REFUSED) for o in outcomes), outcomes
