"""The inference route's two ways in answer alike: the direct path (``server/http/fast_infer.py``, plain
``POST .../infer`` requests answered from the protocol's callbacks) and the ASGI route (everything else:
query strings, chunked bodies, ``Expect``, HTTP/1.0). Raw sockets, so that pipelining, ``Connection: close``
and the exact headers are visible."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("direct") / "repo"
    write_model(
        repo,
        "neg",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "dynamic_batching { }\n",
        {1: test_models.unary("neg", "Neg", TensorProto.FLOAT, ["batch", 4])},
    )
    server = start_server(repo)
    yield server
    server.terminate()


def _json_request(target: str, values: list[float], extra: str = "", version: str = "1.1") -> bytes:
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1, len(values)], "datatype": "FP32", "data": values}]})
    return (
        f"POST {target} HTTP/{version}\r\nHost: t\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def _binary_request(target: str, values: list[float], extra: str = "") -> bytes:
    header = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}],
            "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.array(values, np.float32).tobytes()
    return (
        f"POST {target} HTTP/1.1\r\nHost: t\r\nInference-Header-Content-Length: {len(header)}\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _malformed_request(target: str) -> bytes:
    body = b'{"inputs": [{"name": "IN", '
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (target.encode(), len(body), body)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.heads: list[bytes] = []  # each response's status line and headers, as received

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed before a response head; got {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        self.heads.append(head)
        lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"header {name} sent twice: {head!r}"
            headers[name.lower()] = value.strip()
        length = int(headers.get("content-length", "0"))  # none on "100 Continue"
        while len(self.buffer) < length:
            assert self._fill(), "connection closed inside a response body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        return self.buffer == b"" and not self._fill()


def _exchange(server: ServerProcess, raw: bytes, answers: int = 1) -> list[tuple[int, dict[str, str], bytes]]:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(raw)
        reader = _Reader(sock)
        return [reader.response() for _ in range(answers)]


def _exchange_heads(server: ServerProcess, requests: list[bytes]) -> tuple[list[bytes], list[bytes], bool]:
    """The raw heads and bodies of the answers to ``requests``, each sent on one connection once the one before
    it was answered (a pipelined request waits for the ASGI route), and whether the connection closed after."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        reader = _Reader(sock)
        bodies = []
        for raw in requests:
            sock.sendall(raw)
            bodies.append(reader.response()[2])
        closed = b"connection: close" in reader.heads[-1].lower() and reader.closed()
        return reader.heads, bodies, closed


def _without_clock(head: bytes) -> list[bytes]:
    """A head's lines in order, less ``date`` (it may tick between two answers) and ``server``."""
    return [line for line in head.split(b"\r\n") if not line.lower().startswith((b"date:", b"server:"))]


GZIP = "Accept-Encoding: gzip\r\n"
DEFLATE = "Accept-Encoding: deflate\r\n"
CLOSE = "Connection: close\r\n"
#: requests for one infer target, sent in turn on one connection
Requests = Callable[[str], list[bytes]]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda target: [_json_request(target, [1, 2, 3, 4])], id="json"),
        pytest.param(lambda target: [_binary_request(target, [1, 2, 3, 4])], id="binary"),
        pytest.param(lambda target: [_json_request(target, [1, 2, 3, 4], GZIP)], id="json-accept-gzip"),
        pytest.param(lambda target: [_binary_request(target, [1, 2, 3, 4], DEFLATE)], id="binary-accept-deflate"),
        pytest.param(
            lambda target: [_json_request(target, [1, 2, 3, 4], "Accept-Encoding: gzip, deflate\r\n")],
            id="json-accept-both",
        ),
        pytest.param(lambda target: [_json_request(target, [1, 2, 3])], id="wrong-shape-400"),
        pytest.param(lambda target: [_malformed_request(target)], id="malformed-json-400"),
        pytest.param(lambda target: [_json_request(target.replace("neg", "nope"), [1, 2, 3, 4])], id="unknown-404"),
        pytest.param(
            lambda target: [_json_request(target.replace("neg", "neg/versions/7"), [1, 2, 3, 4])], id="v7-404"
        ),
        pytest.param(lambda target: [_json_request(target, [1, 2, 3, 4], CLOSE)], id="json-close"),
        pytest.param(lambda target: [_binary_request(target, [1, 2, 3, 4], CLOSE)], id="binary-close"),
        pytest.param(lambda target: [_json_request(target, [1, 2, 3], CLOSE)], id="400-close"),
        pytest.param(
            lambda target: [
                _json_request(target, [1, 2, 3, 4], "Connection: keep-alive\r\n"),
                _binary_request(target, [5, 6, 7, 8]),
                _json_request(target, [1, 2, 3]),
                _json_request(target, [9, 10, 11, 12], CLOSE),
            ],
            id="keep-alive-then-close",
        ),
    ],
)
def test_direct_path_and_asgi_route_answer_alike(server: ServerProcess, make: Requests) -> None:
    """Issue 25 part 6: one function (``response_head``) writes both ways' heads, so they match byte for byte
    (apart from the clock): JSON and binary answers, errors, ``Accept-Encoding`` (answers are not compressed
    either way), keep-alive and ``Connection: close``."""
    requests = make("/v2/models/neg/infer")
    before = _paths(server)
    direct = _exchange_heads(server, requests)
    middle = _paths(server)
    # a query string sends the same requests through the ASGI route (the direct path takes plain targets only)
    routed = _exchange_heads(server, make("/v2/models/neg/infer?via=asgi"))
    after = _paths(server)
    count = len(requests)
    assert (middle["direct"] - before["direct"], middle["asgi"] - before["asgi"]) == (count, 0)
    assert (after["direct"] - middle["direct"], after["asgi"] - middle["asgi"]) == (0, count)
    assert [_without_clock(h) for h in direct[0]] == [_without_clock(h) for h in routed[0]]
    assert direct[1] == routed[1]  # the bodies too
    assert direct[2] == routed[2]  # and both closed the connection, or neither
    for head, body in zip(direct[0], direct[1], strict=True):
        lines = _without_clock(head)
        assert sum(line.lower().startswith(b"date: ") for line in head.split(b"\r\n")) == 1
        assert b"content-length: %d" % len(body) in lines
        assert not any(b"encoding" in line for line in lines)  # identity: answers are not compressed
        if lines[0].startswith(b"HTTP/1.1 200"):
            assert b"content-type: application/json" in lines or b"content-type: application/octet-stream" in lines
        else:
            assert lines[1:3] == [b"content-length: %d" % len(body), b"content-type: application/json"]
            assert list(json.loads(body)) == ["error"]  # Triton's error shape
        closing = b"connection: close" in lines
        assert closing == (head is direct[0][-1] and CLOSE.encode() in requests[-1])
    assert direct[2] == (CLOSE.encode() in requests[-1])


def test_a_head_request_leaves_the_connection_clean_for_the_direct_path(server: ServerProcess) -> None:
    """HEAD on the infer target takes the ASGI route (the direct path serves POST only) and its answer has no
    body whatever its Content-Length says: the next request on the connection, a plain POST, is answered by the
    direct path with nothing of the HEAD answer left in between."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        reader = _Reader(sock)
        sock.sendall(b"HEAD /v2/models/neg/infer HTTP/1.1\r\nHost: t\r\n\r\n")
        while b"\r\n\r\n" not in reader.buffer:
            assert reader._fill(), "connection closed before the HEAD answer"
        head, reader.buffer = reader.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 4"), head  # no inference route for HEAD
        before = _paths(server)
        sock.sendall(_json_request("/v2/models/neg/infer", [1, 2, 3, 4]))
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [-1, -2, -3, -4]
        after = _paths(server)
        assert after["direct"] - before["direct"] == 1


def test_pipelined_requests_are_answered_in_order(server: ServerProcess) -> None:
    raw = (
        _json_request("/v2/models/neg/infer", [1, 2, 3, 4])
        + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"
        + _binary_request("/v2/models/neg/infer", [5, 6, 7, 8])
        + _json_request("/v2/models/neg/infer", [9, 10, 11, 12])
    )
    answers = _exchange(server, raw, 4)
    assert [a[0] for a in answers] == [200, 200, 200, 200]
    assert json.loads(answers[0][2])["outputs"][0]["data"] == [-1, -2, -3, -4]
    split = int(answers[2][1]["inference-header-content-length"])
    assert np.frombuffer(answers[2][2][split:], np.float32).tolist() == [-5, -6, -7, -8]
    assert json.loads(answers[3][2])["outputs"][0]["data"] == [-9, -10, -11, -12]


def test_connection_close_from_the_client_is_honoured(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(_json_request("/v2/models/neg/infer", [1, 2, 3, 4], extra="Connection: close\r\n"))
        reader = _Reader(sock)
        status, headers, _ = reader.response()
        assert status == 200
        assert headers["connection"] == "close"
        assert reader.closed()


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_json_request("/v2/models/neg/infer", [1, 2, 3, 4], version="1.0"), id="http-1.0"),
        pytest.param(
            _json_request("/v2/models/neg/infer", [1, 2, 3, 4], extra="Expect: 100-continue\r\n"), id="expect"
        ),
        pytest.param(
            b"POST /v2/models/neg/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(_json_request("", [1, 2, 3, 4]).split(b"\r\n\r\n", 1)[1])
            + _json_request("", [1, 2, 3, 4]).split(b"\r\n\r\n", 1)[1]
            + b"\r\n0\r\n\r\n",
            id="chunked",
        ),
    ],
)
def test_requests_the_direct_path_leaves_to_the_asgi_route_are_served(server: ServerProcess, raw: bytes) -> None:
    answers = _exchange(server, raw, 2 if b"Expect" in raw else 1)
    if b"Expect" in raw:
        assert answers[0][0] == 100  # the ASGI route asked for the body
    final = answers[-1]
    assert final[0] == 200
    assert json.loads(final[2])["outputs"][0]["data"] == [-1, -2, -3, -4]


def _paths(server: ServerProcess) -> dict[str, float]:
    """``kubeinfer_http_infer_requests`` by path, from the metrics port."""
    counts = {}
    for line in httpx.get(server.metrics_url, timeout=30).text.splitlines():
        if line.startswith("kubeinfer_http_infer_requests{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('path="', 1)[1].split('"', 1)[0]] = float(value)
    return counts


def test_a_plain_request_takes_the_direct_path_and_the_server_says_which_path_serves(server: ServerProcess) -> None:
    """Issue 25 part 6: the direct path is on uvicorn's internals, so a test must notice if it stops serving
    (a uvicorn upgrade, a missing httptools): the log at start says which path serves inference, and the
    metrics count each request by the path that answered it."""
    assert "the direct path answers plain requests inside uvicorn" in server.log()
    url = f"{server.base_url}/v2/models/neg/infer"
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    before = _paths(server)
    assert httpx.post(url, json=body, timeout=30).status_code == 200  # httpx: plain, Content-Length
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("neg", [inp]).as_numpy("OUT").tolist() == [[-1.0] * 4]  # tritonclient, binary
    client.close()
    after = _paths(server)
    assert (after["direct"] - before["direct"], after["asgi"] - before["asgi"]) == (2, 0)
    assert httpx.post(url + "?via=asgi", json=body, timeout=30).status_code == 200  # a query: the ASGI route
    final = _paths(server)
    assert (final["direct"] - after["direct"], final["asgi"] - after["asgi"]) == (0, 1)
