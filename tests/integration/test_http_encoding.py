"""Issue 26, HTTP details: compressed request bodies and manually chunked ones, answered as Triton answers them.

Triton 2.51 (src/http_server.cc) inflates an inference body sent with ``Content-Encoding: gzip`` or ``deflate``
(tritonclient's ``request_compression_algorithm``), answers other codings 415 with ``Accept-Encoding: gzip,
deflate``, and reads a body chunked by hand even when the client also sent a Content-Length (what ``requests``
does with ``Transfer-Encoding: chunked`` in its headers: Triton's own ``test_content_encoding_chunked_manually``).
We answered 400 to both. Our additions: the inflated size is held to ``--http-max-input-size`` and a corrupt
or cut-off stream is a 400 saying so.
"""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.byte_counter import ByteCounter
from tests.support.repos import write_model
from tests.support.server import ServerProcess, http_transports, start_server

MAX_BODY = 1 << 20
RAW = {"Inference-Header-Content-Length": "0"}


@pytest.fixture(scope="module", params=http_transports())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("encoding") / "repo"
    write_model(
        repo,
        "neg",
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
        {1: test_models.unary("neg", "Neg", TensorProto.FLOAT, ["batch", "n"])},
    )
    s = start_server(repo, "--http-max-input-size", str(MAX_BODY), "--http-transport", request.param)
    yield s
    assert s.terminate() == 0


def _url(server: ServerProcess) -> str:
    return f"{server.base_url}/v2/models/neg/infer"


def _json_body(values: list[float]) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, len(values)], "data": values}]}
    ).encode()


def _still_serving(server: ServerProcess) -> None:
    r = httpx.post(_url(server), content=_json_body([1.0, -2.0]), timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [-1.0, 2.0], r.text


def _chunked(data: bytes, size: int = 7) -> bytes:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%X\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_a_raw_body_chunked_by_hand_with_a_content_length_is_read_as_chunked(server: ServerProcess) -> None:
    """Triton's test_content_encoding_chunked_manually: both headers, the body chunk-encoded by the client.
    Answered, and the connection closed after it (RFC 9112 6.1: no request can be smuggled behind it)."""
    x = np.arange(8, dtype=np.float32)
    body = _chunked(x.tobytes())
    head = (
        "POST /v2/models/neg/infer HTTP/1.1\r\nHost: t\r\nInference-Header-Content-Length: 0\r\n"
        f"Transfer-Encoding: chunked\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head.encode() + body + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):  # the server closes after one answer
            answer += chunk
    head_bytes, _, payload = answer.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head_bytes.decode().split("\r\n")[1:])
    assert head_bytes.startswith(b"HTTP/1.1 200") and headers["connection"] == "close", answer
    split = int(headers["inference-header-content-length"])
    assert np.frombuffer(payload[split:], np.float32).tolist() == (-x).tolist()
    assert b"HTTP/1.1" not in payload  # the request after it was not read
    # what Triton's test sends: requests adds the Content-Length itself (httpx would chunk the body again)
    r = requests.post(_url(server), data=body, headers={**RAW, "Transfer-Encoding": "chunked"}, timeout=30)
    assert r.request.headers["Content-Length"] == str(len(body))
    assert r.status_code == 200 and r.headers["connection"] == "close", r.text
    split = int(r.headers["inference-header-content-length"])
    assert np.frombuffer(r.content[split:], np.float32).tolist() == (-x).tolist()
    _still_serving(server)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_compressed_requests_are_served(server: ServerProcess, algorithm: str, binary: bool) -> None:
    x = np.tile(np.array([1.0, -2.0], np.float32), 2048).reshape(1, 4096)  # 16 KB that compress to a few dozen
    inp = httpclient.InferInput("IN", [1, 4096], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    sent = {}
    for request in (None, algorithm):
        for response in (None, "gzip", "deflate"):  # the answer comes back uncompressed either way
            with ByteCounter(server.http_url) as wire:  # what the client sent, counted on the wire
                client = httpclient.InferenceServerClient(wire.address)
                try:
                    result = client.infer(
                        "neg", [inp], request_compression_algorithm=request, response_compression_algorithm=response
                    )
                finally:
                    client.close()
                np.testing.assert_array_equal(result.as_numpy("OUT"), -x)
                sent[request, response] = wire.sent
    for response in (None, "gzip", "deflate"):
        assert sent[None, response] > x.nbytes > 4 * sent[algorithm, response], sent


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP", "identity"])
def test_raw_and_json_bodies_in_each_coding(server: ServerProcess, encoding: str) -> None:
    x = np.arange(5, dtype=np.float32)
    code = {"gzip": gzip.compress, "deflate": zlib.compress, "identity": bytes}[encoding.lower()]
    r = httpx.post(_url(server), content=code(x.tobytes()), headers={**RAW, "Content-Encoding": encoding}, timeout=30)
    assert r.status_code == 200, r.text
    split = int(r.headers["inference-header-content-length"])
    assert np.frombuffer(r.content[split:], np.float32).tolist() == (-x).tolist()
    r = httpx.post(_url(server), content=code(_json_body([3.0])), headers={"Content-Encoding": encoding}, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [-3.0], r.text


def test_an_unknown_coding_is_415_with_the_codings_the_server_reads(server: ServerProcess) -> None:
    for coding in ("br", "compress", "gzip, deflate"):
        r = httpx.post(_url(server), content=_json_body([1.0]), headers={"Content-Encoding": coding}, timeout=30)
        assert r.status_code == 415 and r.headers["accept-encoding"] == "gzip, deflate", r.text
        assert r.json()["error"] == (
            f"unsupported Content-Encoding '{coding}': this server reads gzip, deflate or identity request bodies"
        )
    _still_serving(server)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 400, "nothing to be decompressed"),
        (b"this is not gzip data", 400, "the request body is not valid gzip data (Content-Encoding: gzip)"),
        (gzip.compress(_json_body([1.0]))[:-12], 400, "the request body's gzip stream is cut off"),
        (
            gzip.compress(b" " * (MAX_BODY + 1)),  # 1 KiB on the wire, just over the limit once inflated
            413,
            f"Request size of more than {MAX_BODY} decompressed bytes exceeds the maximum allowed value of "
            f"{MAX_BODY} bytes. Use --http-max-input-size to increase the limit.",
        ),
    ],
    ids=["empty", "not-gzip", "cut-off", "bomb"],
)
def test_bodies_that_do_not_inflate_are_refused_with_the_reason(
    server: ServerProcess, body: bytes, status: int, message: str
) -> None:
    r = httpx.post(_url(server), content=body, headers={"Content-Encoding": "gzip"}, timeout=30)
    assert r.status_code == status and message in r.json()["error"], r.text
    _still_serving(server)
