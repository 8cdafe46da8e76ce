"""``--connection-drain-seconds``: after SIGTERM the server keeps answering for that long, but sends its
connections away — every HTTP response says ``Connection: close`` and gRPC channels get a GOAWAY —, with
readiness false; then it drains as without the flag (new requests 503, in-flight ones finish) and exits 0.

Behind a Kubernetes Service this moves clients whose keep-alive connection is pinned to a terminating pod
(the endpoint is gone, the connection is not) to another replica instead of answering them 503; the
operator sets the flag on every server pod. e2e/test_user_path.py deletes a pod under load to show it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto

from tests.support.models import unary
from tests.support.server import grpc_transports, start_server
from tests.support.waiting import wait_for

MODEL = "relu"
BODY = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [-1.0, 2.0, -3.0, 4.0]}]}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / MODEL / "1").mkdir(parents=True)
    onnx.save(unary(MODEL, "Relu", TensorProto.FLOAT, ["batch", 4]), tmp_path / "repo" / MODEL / "1" / "model.onnx")
    (tmp_path / "repo" / MODEL / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    return tmp_path / "repo"


@pytest.mark.parametrize("transport", grpc_transports())
def test_stopping_server_answers_and_sends_keep_alive_clients_away(repo: Path, tmp_path: Path, transport: str) -> None:
    server = start_server(
        repo, "--connection-drain-seconds", "3", "--shutdown-timeout", "5", "--grpc-transport", transport,
        log_dir=tmp_path,
    )  # fmt: skip
    try:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([[-1, 2, -3, 4]], np.float32))
        assert grpc.infer(MODEL, [inp]).as_numpy("OUT").tolist() == [[0, 2, 0, 4]]
        with httpx.Client(base_url=server.base_url, timeout=10) as http:  # one keep-alive connection
            first = http.post(f"/v2/models/{MODEL}/infer", json=BODY)
            assert first.status_code == 200 and first.headers.get("connection") != "close"
            server.proc.send_signal(signal.SIGTERM)
            wait_for(
                "readiness to drop",
                lambda: httpx.get(f"{server.base_url}/v2/health/ready", timeout=5).status_code == 503,
                timeout=10,
            )
            # the pinned client is still answered, and told to reconnect
            r = http.post(f"/v2/models/{MODEL}/infer", json=BODY)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [0, 2, 0, 4]
            assert r.headers["connection"] == "close"
            assert "for clients to move to other replicas" in server.log()
            # gRPC got a GOAWAY: a new RPC on this channel finds no listener any more (behind a Service it would
            # reconnect to another replica)
            with pytest.raises(Exception, match="UNAVAILABLE"):
                grpc.infer(MODEL, [inp], client_timeout=5)
            # then the drain as without the flag: new requests are refused, the process exits 0
            wait_for(
                "the drain to refuse new requests",
                lambda: "shutting down: draining in-flight requests" in server.log(),
                timeout=15,
            )
            assert server.proc.wait(30) == 0, server.log()[-3000:]
        grpc.close()
    finally:
        server.terminate()  # a no-op when it already exited; no server outlives a failed test


def _client_ports(server_port: int) -> set[int]:
    """Local ports of the established TCP connections to ``server_port`` (this network namespace)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # grpc's sockets are IPv6 (IPv4-mapped) where it can
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _calls_across_recycles(
    repo: Path, tmp_path: Path, transport: str, age_ms: int, channels: int, connections: int
) -> tuple[list[str], int]:
    """A server with ``--grpc-max-connection-age age_ms``; ``channels`` tritonclient channels call it in a loop
    until ``connections`` client connections have been seen (the first ones and their replacements).
    Returns every failed call's error and the number of calls answered right; the server must exit 0."""
    server = start_server(
        repo, "--grpc-max-connection-age", str(age_ms), "--grpc-transport", transport, log_dir=tmp_path
    )
    port = int(server.grpc_url.rsplit(":", 1)[1])
    failures: list[str] = []
    calls = [0]
    stop = threading.Event()

    def call() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([[-1, 2, -3, 4]], np.float32))
        try:
            while not stop.is_set():
                try:
                    assert client.infer(MODEL, [inp], client_timeout=10).as_numpy("OUT").tolist() == [[0, 2, 0, 4]]
                    calls[0] += 1
                except Exception as exc:  # every failure counts
                    failures.append(str(exc))
        finally:
            client.close()

    threads = [threading.Thread(target=call, daemon=True) for _ in range(channels)]
    for t in threads:
        t.start()
    seen: set[int] = set()
    try:
        # each connection lives age_ms (+-10 %), so new client ports keep appearing
        wait_for(f"{connections} connections, the first ones replaced after their max age",
                 lambda: seen.update(_client_ports(port)) or len(seen) >= connections,
                 timeout=60, interval=min(0.1, age_ms / 10_000))  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        exit_code = server.terminate()
    assert exit_code == 0, server.log()[-3000:]
    return failures, calls[0]


@pytest.mark.parametrize("transport", grpc_transports())
def test_grpc_connections_are_recycled_gracefully_at_the_max_age(repo: Path, tmp_path: Path, transport: str) -> None:
    """--grpc-max-connection-age (Triton's flag, milliseconds): each connection gets a graceful GOAWAY after that long and the channels
    reconnect (behind a Service: to any replica) without a failed call; the server keeps accepting calls
    meanwhile, unlike a stopping server (whose not-yet-dispatched calls end CANCELLED)."""
    failures, calls = _calls_across_recycles(repo, tmp_path, transport, age_ms=1000, channels=4, connections=12)
    assert failures == [], failures[:5]
    assert calls > 0


@pytest.mark.parametrize("transport", grpc_transports())
def test_no_call_fails_while_busy_connections_are_recycled(repo: Path, tmp_path: Path, transport: str) -> None:
    """Many recycles of a connection that always has calls in flight: 32 channels share one connection (grpc
    shares a subchannel among channels with the same target and arguments), which is sent away every 100 ms.

    The graceful GOAWAY (last stream 2^31-1, a PING, then the last stream id processed) races with calls the
    client opened before it read the first GOAWAY and wrote after answering the PING: the server ignores
    them and the client retries them on its next connection. Two ways that failed calls on the Rust transport
    (a few per hundred recycles here): h2 0.4.20 took such a stream's WINDOW_UPDATE for one on an idle stream
    and failed the connection with PROTOCOL_ERROR (server/grpc/rust/vendor/README.md), and closing the socket
    with those frames unread sent a TCP RST that destroyed the last responses (the transport's lingering close)."""
    failures, calls = _calls_across_recycles(repo, tmp_path, transport, age_ms=100, channels=32, connections=100)
    assert failures == [], (len(failures), failures[:3])
    assert calls > 0
