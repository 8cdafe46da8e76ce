"""Issue 15 part 2: every request limit answers with the status and the flag's name, before the work is done.

One real server with small limits (so the tests send small requests). Each limit is hit over HTTP and,
where the protocol has it, over gRPC; after each refusal the server still answers a good request.
"""

from __future__ import annotations

import json
import queue
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support.models import binary, string_identity, unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, grpc_transports, http_transports, start_server
from tests.support.sleep_models import Gate, require_sleep_backend, wait_pending, write_sleep_model
from tests.support.waiting import wait_for

MAX_BODY = 1 << 20
LIMIT_FLAGS = [
    "--http-max-input-size", str(MAX_BODY),
    "--grpc-max-message-bytes", str(MAX_BODY),
    "--max-header-bytes", "8192",
    "--max-tensor-elements", "1000",
    "--max-request-elements", "1500",
    "--max-bytes-element-size", "100",
    "--max-inputs", "3",
    "--grpc-max-stream-inflight", "2",
    "--request-timeout", "2",
]  # fmt: skip


def _transports() -> list[object]:
    """(--grpc-transport, --http-transport): each gRPC transport with uvicorn, and the native HTTP one."""
    grpc = grpc_transports()
    native = http_transports()[1]
    return [
        *(pytest.param((p.values[0], "asgi"), marks=p.marks, id=f"{p.values[0]}-asgi") for p in grpc),
        pytest.param(("rust", "native"), marks=[*grpc[1].marks, *native.marks], id="rust-native"),
    ]


@pytest.fixture(scope="module", params=_transports())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Every test runs on each gRPC transport (--grpc-transport) and each HTTP one (--http-transport)."""
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("limits") / "repo"
    cfg = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    write_model(repo, "relu", cfg, {1: unary("relu", "Relu", TensorProto.FLOAT, ["batch", "n"])})
    write_model(repo, "add", cfg, {1: binary("add", "Add", TensorProto.FLOAT, ["batch", "n"])})
    write_model(repo, "strings", cfg, {1: string_identity()})
    write_sleep_model(repo, "sleepy", 0, max_batch_size=0)  # one instance: the rest of the requests queue
    write_sleep_model(repo, "hang", 0, body="instance_group [ { count: 2 kind: KIND_CPU } ]\n", max_batch_size=0)
    grpc, http = request.param
    s = start_server(repo, *LIMIT_FLAGS, "--grpc-transport", grpc, "--http-transport", http)
    yield s
    assert s.terminate() == 0


def _relu_body(n: int, **extra: object) -> dict:
    return {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, n], "data": [1.0] * n}], **extra}


def _good(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}/v2/models/relu/infer", json=_relu_body(4), timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0] * 4, r.text
    assert httpx.get(f"{server.base_url}/v2/health/ready", timeout=10).status_code == 200


def _raw_http(server: ServerProcess, head: bytes, body: bytes = b"", timeout: float = 30) -> tuple[int, bytes]:
    """Send bytes as they are; returns the status and the whole answer (status 0: the server hung up)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout) as sock:
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before it had all of it
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    return (int(answer.split(b" ", 2)[1]) if answer else 0), answer


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


# ------------------------------------------------------------------------------------------- body


@pytest.mark.parametrize("path", ["/v2/models/relu/infer", "/v2/repository/index", "/v2/models/relu/versions/1/infer"])
def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(server: ServerProcess, path: str) -> None:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n"
    )
    status, answer = _raw_http(server, head.encode())  # not one byte of the body: the answer must not wait for it
    assert status == 413, answer
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error == (
        f"Request size of {MAX_BODY + 1} bytes exceeds the maximum allowed value of {MAX_BODY} bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    assert b"connection: close" in answer.lower()
    _good(server)


def test_a_chunked_body_over_the_limit_is_refused_once_it_passes_the_limit(server: ServerProcess) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 65536  # 2.5 MiB of JSON whitespace, never a whole request

    r = httpx.post(f"{server.base_url}/v2/models/relu/infer", content=chunks(), timeout=30)
    assert r.status_code == 413 and "--http-max-input-size" in r.json()["error"], r.text
    _good(server)


def test_a_body_under_the_limit_is_served(server: ServerProcess) -> None:
    body = _relu_body(4, id="x" * (MAX_BODY - 200))
    r = httpx.post(f"{server.base_url}/v2/models/relu/infer", json=body, timeout=30)
    assert r.status_code == 200 and len(r.json()["id"]) == MAX_BODY - 200


# ---------------------------------------------------------------------------------------- headers


def test_headers_over_the_limit_get_431_and_smaller_ones_work(server: ServerProcess) -> None:
    big = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    status, answer = _raw_http(server, big)
    assert status == 431 and b"--max-header-bytes" in answer, answer
    # 5 MB of header: refused once the limit passes (the client may see the 431 or, still sending, a reset)
    huge = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5_000_000 + b"\r\n\r\n"
    status, answer = _raw_http(server, huge)
    if status:  # a client still sending may see the connection reset (status 0) before it reads the answer
        assert status == 431 and b"--max-header-bytes" in answer, answer
    status, _ = _raw_http(server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Small: " + b"a" * 4000 + b"\r\n\r\n")
    assert status == 200
    _good(server)


def test_keep_alive_connections_count_each_request_head_on_its_own(server: ServerProcess) -> None:
    """Many requests on one connection, each under the limit, add up to far more than it: all served."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for _ in range(20):
            r = client.post("/v2/models/relu/infer", json=_relu_body(4), headers={"X-Pad": "p" * 4000})
            assert r.status_code == 200


def test_grpc_metadata_over_the_limit_is_refused(server: ServerProcess, grpc_client) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.is_server_live(headers={"x-big": "a" * 9000})
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED", info.value
    assert "vs. 8192" in info.value.message()
    assert grpc_client.is_server_live()


# -------------------------------------------------------------------------------- elements, inputs


def _grpc_infer(client, model: str, arrays: dict[str, np.ndarray], datatype: str = "FP32"):
    inputs = []
    for name, array in arrays.items():
        inp = grpcclient.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return client.infer(model, inputs)


def test_elements_per_tensor(server: ServerProcess, grpc_client) -> None:
    # the shape alone is refused: no data is read or allocated for it
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 10**12], "data": []}]}
    r = httpx.post(f"{server.base_url}/v2/models/relu/infer", json=body, timeout=30)
    assert r.status_code == 400 and "the limit per tensor (--max-tensor-elements)" in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(grpc_client, "relu", {"IN": np.ones((1, 1001), np.float32)})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "--max-tensor-elements" in info.value.message()
    assert _grpc_infer(grpc_client, "relu", {"IN": np.ones((1, 1000), np.float32)}).as_numpy("OUT").shape == (1, 1000)
    _good(server)


def test_elements_per_request(server: ServerProcess, grpc_client) -> None:
    a = np.ones((1, 800), np.float32)
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(grpc_client, "add", {"A": a, "B": a})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "--max-request-elements" in info.value.message()
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 800], "data": [1.0] * 800} for n in "AB"]}
    r = httpx.post(f"{server.base_url}/v2/models/add/infer", json=body, timeout=30)
    assert r.status_code == 400 and "--max-request-elements" in r.json()["error"]
    small = np.ones((1, 700), np.float32)
    np.testing.assert_array_equal(_grpc_infer(grpc_client, "add", {"A": small, "B": small}).as_numpy("OUT"), 2 * small)


def test_number_of_inputs(server: ServerProcess, grpc_client) -> None:
    body = {"inputs": [{"name": f"X{i}", "datatype": "FP32", "shape": [1], "data": [1.0]} for i in range(4)]}
    r = httpx.post(f"{server.base_url}/v2/models/relu/infer", json=body, timeout=30)
    assert r.status_code == 400 and "4 inputs, over the limit of 3 (--max-inputs)" in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(grpc_client, "relu", {f"X{i}": np.ones((1, 1), np.float32) for i in range(4)})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "--max-inputs" in info.value.message()
    _good(server)


def test_bytes_element_length(server: ServerProcess, grpc_client) -> None:
    long = np.array([[b"x" * 101, b"a", b"b", b"c"]], dtype=np.object_)
    ok = np.array([[b"x" * 100, b"a", b"b", b"c"]], dtype=np.object_)
    # gRPC raw contents
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(grpc_client, "strings", {"IN": long}, "BYTES")
    assert "BYTES element 0 is 101 bytes, over the limit of 100 (--max-bytes-element-size)" in info.value.message()
    assert _grpc_infer(grpc_client, "strings", {"IN": ok}, "BYTES").as_numpy("OUT")[0, 0] == b"x" * 100
    # HTTP binary and JSON
    client = httpclient.InferenceServerClient(server.http_url)
    for binary_data in (True, False):
        inp = httpclient.InferInput("IN", [1, 4], "BYTES")
        inp.set_data_from_numpy(long, binary_data=binary_data)
        with pytest.raises(InferenceServerException) as info:
            client.infer("strings", [inp])
        assert "--max-bytes-element-size" in info.value.message(), info.value
    client.close()
    _good(server)


def test_a_huge_bytes_shape_with_no_data_is_refused_without_allocating(server: ServerProcess) -> None:
    """Within the element limit, but the data cannot hold that many elements: refused from its size."""
    header = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1, 1000], "parameters": {"binary_data_size": 8}}]}
    ).encode()
    body = header + struct.pack("<I", 4) + b"abcd"
    r = httpx.post(
        f"{server.base_url}/v2/models/strings/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=30,
    )
    assert r.status_code == 400 and "BYTES data holds fewer than 1000 elements" in r.json()["error"], r.text


# --------------------------------------------------------------------------------- gRPC messages


def test_grpc_messages_over_the_limit_are_refused(server: ServerProcess, grpc_client) -> None:
    big = np.ones((1, 1000), np.float32)
    with pytest.raises(InferenceServerException) as info:
        # 1000 elements pass the element limit, but 300 KB of padding in the id pushes the message past 1 MiB
        inp = grpcclient.InferInput("IN", [1, 1000], "FP32")
        inp.set_data_from_numpy(big)
        grpc_client.infer("relu", [inp], request_id="x" * (MAX_BODY + 10))
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED", info.value
    _good(server)


# ---------------------------------------------------------------------------------- the deadline


def test_a_request_that_runs_past_the_deadline_gets_504_and_the_server_goes_on(
    server: ServerProcess, grpc_client, tmp_path: Path
) -> None:
    """The model is held at a gate the test opens only after the answers came: they came at the deadline."""
    with Gate(tmp_path) as gate:
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}],
            "parameters": gate.params,
        }
        r = httpx.post(f"{server.base_url}/v2/models/hang/infer", json=body, timeout=30)
        assert r.status_code == 504, r.text
        assert r.json()["error"] == (
            "request for model 'hang' did not finish within the server's request timeout of 2s (--request-timeout)"
        )
        inp = grpcclient.InferInput("INPUT0", [2], "FP32")
        inp.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        with pytest.raises(InferenceServerException) as info:
            grpc_client.infer("hang", [inp], parameters=gate.params)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED", info.value
        assert "--request-timeout" in info.value.message()
        assert gate.entered() == 2  # both executed, and were still held when the deadline answered them
    _good(server)


# ------------------------------------------------------------------------ gRPC stream concurrency


def test_a_stream_runs_at_most_the_inflight_limit_at_once(server: ServerProcess, tmp_path: Path) -> None:
    """'sleepy' has one instance and each request its own gate: with two of the stream's requests let in,
    one executes and exactly one waits in the queue, step after step, until the last is let in."""
    gates = [Gate(tmp_path) for _ in range(8)]
    inp = grpcclient.InferInput("INPUT0", [2], "FP32")
    inp.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    answers = []
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i, gate in enumerate(gates):
            client.async_stream_infer("sleepy", [inp], request_id=str(i), parameters=gate.params)
        for i, gate in enumerate(gates):
            gate.wait_entered()  # request i executes, held; the stream answered the ones before it
            # without the limit all eight would be in by now: seven queued behind the first
            wait_pending(server.metrics_url, "sleepy", 1 if i < 7 else 0)
            assert [g.entered() for g in gates] == [1] * (i + 1) + [0] * (7 - i)
            gate.open()
            answers.append(results.get(timeout=60))
    finally:
        for gate in gates:
            gate.open()
        client.stop_stream()
        client.close()
    assert [error for _, error in answers] == [None] * 8
    assert [int(result.get_response().id) for result, _ in answers] == list(range(8))


# --------------------------------------------------------------------------------- slow clients

SLOW_FLAGS = ["--http-header-timeout", "1", "--http-body-timeout", "1", "--http-max-connections", "4"]


@pytest.fixture(scope="module", params=http_transports())
def slow_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Issue 25 part 6: short head and body timeouts and a cap of four connections, on each HTTP transport."""
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("slow") / "repo"
    write_model(repo, "relu", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', {1: unary("relu", "Relu", TensorProto.FLOAT, ["batch", "n"])})  # fmt: skip
    write_sleep_model(repo, "sleepy", 1500, max_batch_size=0)  # runs longer than both timeouts
    s = start_server(repo, *SLOW_FLAGS, "--http-transport", str(request.param))
    yield s
    assert s.terminate() == 0


class _Slowloris:
    """A client that opens a connection and sends its request a few bytes at a time, never finishing."""

    def __init__(self, server: ServerProcess, start: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        if start:
            self.sock.sendall(start)

    def drip(self, data: bytes, every: float = 0.2) -> bytes:
        """Sends ``data`` a byte at a time until the server answers and hangs up; returns its answer."""
        answer = b""
        self.sock.settimeout(every)
        for i in range(len(data)):
            try:
                self.sock.sendall(data[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        self.sock.settimeout(30)
        try:
            while chunk := self.sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return answer

    def close(self) -> None:
        self.sock.close()


def _error_of(answer: bytes) -> tuple[int, dict[str, str], str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)["error"]


def test_a_head_sent_slowly_gets_408_and_the_connection_closes(slow_server: ServerProcess) -> None:
    client = _Slowloris(slow_server, b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: t\r\n")
    start = time.monotonic()
    answer = client.drip(b"X-Slow: " + b"a" * 200)  # 40 s at this rate; the head timeout is 1 s
    client.close()
    status, headers, error = _error_of(answer)
    assert status == 408 and headers["connection"] == "close", answer
    assert error == "the request head did not arrive within 1 s (--http-header-timeout)"
    assert time.monotonic() - start < 10
    _good(slow_server)


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(slow_server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", slow_server.http_port), timeout=30) as sock:
        start = time.monotonic()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        assert time.monotonic() - start < 10
    assert _error_of(answer)[0] == 408


@pytest.mark.parametrize("path", ["/v2/models/relu/infer", "/v2/repository/index"], ids=["direct", "asgi"])
def test_a_body_sent_slowly_gets_408(slow_server: ServerProcess, path: str) -> None:
    """On the direct path (a plain infer request) and on the ASGI route alike."""
    body = json.dumps(_relu_body(4)).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    client = _Slowloris(slow_server, head)
    answer = client.drip(body)
    client.close()
    status, headers, error = _error_of(answer)
    assert status == 408 and headers["connection"] == "close", answer
    assert error == "the request body did not arrive within 1 s (--http-body-timeout)"
    _good(slow_server)


def test_the_timeouts_bound_sending_not_idling_or_computing(slow_server: ServerProcess) -> None:
    """A kept-alive connection may wait longer than the head timeout between requests, and a request may
    compute longer than both timeouts: only sending a head or a body is timed."""
    request = "POST /v2/models/sleepy/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]})
    with socket.create_connection(("127.0.0.1", slow_server.http_port), timeout=30) as sock:
        for _ in range(2):
            sock.sendall((request % (len(body), body)).encode())  # computes 1.5 s
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
                chunk = sock.recv(65536)
                assert chunk, f"the server closed the connection: {answer!r}"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer
            time.sleep(1.5)  # idle on the kept-alive connection, longer than the head timeout


def test_past_the_connection_cap_requests_get_503_until_connections_close(slow_server: ServerProcess) -> None:
    idle = [socket.create_connection(("127.0.0.1", slow_server.http_port), timeout=30) for _ in range(4)]
    try:
        time.sleep(0.2)  # the server has accepted them
        r = httpx.post(f"{slow_server.base_url}/v2/models/relu/infer", json=_relu_body(4), timeout=30)
        assert r.status_code == 503 and r.headers["connection"] == "close", r.text
        assert r.json()["error"] == (
            "the server has more than 4 HTTP connections open (--http-max-connections): try again later"
        )
    finally:
        for sock in idle:
            sock.close()
    wait_for(
        "the cap to let requests in again",
        lambda: (
            httpx.post(f"{slow_server.base_url}/v2/models/relu/infer", json=_relu_body(4), timeout=30).status_code
            == 200
        ),
        10,
    )


def test_limit_flags_are_documented() -> None:
    flag_table = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    for flag in [*LIMIT_FLAGS[::2], *SLOW_FLAGS[::2]]:
        assert f"`{flag}`" in flag_table, flag
