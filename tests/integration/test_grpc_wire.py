"""gRPC on the wire, the same on both transports (--grpc-transport): compressed requests and the message
size limit (--grpc-max-message-bytes) both ways, with grpc.aio's (grpc-core's) statuses and texts.

tritonclient compresses requests with ``compression_algorithm="gzip"|"deflate"``; what a client cannot send
(an unknown ``grpc-encoding``, a compressed flag without an encoding) is sent with curl's HTTP/2 (raw gRPC
framing). Responses are never compressed (legal in gRPC: the client learns it from the missing grpc-encoding).
"""

from __future__ import annotations

import gzip
import queue
import time
import zlib
from collections.abc import Iterator

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support import h2client
from tests.support.byte_counter import ByteCounter
from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, grpc_transports, start_server
from tests.support.sleep_models import stats
from tests.support.waiting import wait_for

MAX = 64 * 1024
#: tile's output is this many times its input
TILES = 64
LIVE = "/inference.GRPCInferenceService/ServerLive"


def tile() -> onnx.ModelProto:
    """OUT = IN repeated TILES times: a small request with a large response."""
    repeats = helper.make_tensor("repeats", TensorProto.INT64, [1], [TILES])
    graph = helper.make_graph(
        [helper.make_node("Tile", ["IN", "repeats"], ["OUT"])],
        "tile",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["m"])],
        initializer=[repeats],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module", params=grpc_transports())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("wire") / "repo"
    cfg = 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
    write_model(repo, "relu", cfg, {1: unary("relu", "Relu", TensorProto.FLOAT, ["n"])})
    write_model(repo, "tile", cfg, {1: tile()})
    flags = ["--grpc-max-message-bytes", str(MAX), "--grpc-max-stream-inflight", "2"]
    s = start_server(repo, *flags, "--grpc-transport", str(request.param))
    yield s
    assert s.terminate() == 0


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def _input(values: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("IN", list(values.shape), "FP32")
    inp.set_data_from_numpy(values)
    return inp


def _refused(call: object, *args: object, **kwargs: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value


def _good(client: grpcclient.InferenceServerClient) -> None:
    """The server goes on serving after a refusal."""
    out = client.infer("relu", [_input(np.array([-1.0, 2.0], np.float32))]).as_numpy("OUT")
    np.testing.assert_array_equal(out, [0.0, 2.0])


# ------------------------------------------------------------------------------------ compression


def _sent(server: ServerProcess, values: np.ndarray, algorithm: str | None) -> int:
    """Bytes a fresh client sent for one relu call (connection set-up included), counted on the wire."""
    with ByteCounter(server.grpc_url) as wire:
        c = grpcclient.InferenceServerClient(wire.address)
        try:
            out = c.infer("relu", [_input(values)], compression_algorithm=algorithm).as_numpy("OUT")
        finally:
            c.close()
        np.testing.assert_array_equal(out, np.maximum(values, 0))
        return wire.sent


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_served(server: ServerProcess, algorithm: str) -> None:
    values = np.tile(np.array([-1.0, 2.0], np.float32), 2000)  # 16 KB that compress to a few dozen bytes
    plain, compressed = _sent(server, values, None), _sent(server, values, algorithm)
    assert plain > values.nbytes and compressed < values.nbytes / 4, (plain, compressed)


def _streamed(server: ServerProcess, algorithm: str | None) -> int:
    """Three relu calls on one stream of a fresh client; the bytes it sent, counted on the wire."""
    results: queue.Queue = queue.Queue()
    with ByteCounter(server.grpc_url) as wire:
        client = grpcclient.InferenceServerClient(wire.address)
        client.start_stream(
            callback=lambda result, error: results.put((result, error)), compression_algorithm=algorithm
        )
        try:
            for i in range(3):
                values = np.full(4000, i - 1, np.float32)
                client.async_stream_infer("relu", [_input(values)], request_id=str(i))
            answers = [results.get(timeout=60) for _ in range(3)]
        finally:
            client.stop_stream()
            client.close()
        sent = wire.sent
    assert [error for _, error in answers] == [None] * 3
    for result, _ in answers:
        i = int(result.get_response().id)
        np.testing.assert_array_equal(result.as_numpy("OUT"), np.full(4000, max(i - 1, 0), np.float32))
    return sent


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_stream_requests_are_served(server: ServerProcess, algorithm: str) -> None:
    plain, compressed = _streamed(server, None), _streamed(server, algorithm)
    assert plain > 3 * 16000 > 4 * compressed, (plain, compressed)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_the_limit_holds_for_the_decompressed_size(client: grpcclient.InferenceServerClient, algorithm: str) -> None:
    """A request id of 2 * MAX bytes compresses to a few hundred: refused once decompressed, as grpc does."""
    values = np.ones(4, np.float32)
    error = _refused(client.infer, "relu", [_input(values)], request_id="x" * 2 * MAX, compression_algorithm=algorithm)
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED", error
    assert error.message() == "Decompressed message larger than max", error
    _good(client)


def _curl_grpc(server: ServerProcess, body: bytes, *headers: str) -> dict[str, str]:
    """One raw gRPC call to ServerLive over HTTP/2 (``tests.support.h2client``): the response's headers and
    trailers by name, ``grpc-message`` percent-decoded as clients read it. A server may answer before it reads
    the body and then reset the stream (RFC 9113 8.1); the answer is read either way (curl 7.88 reported such
    a reset as error 92 at random, failing the call it had already been answered)."""
    metadata = [tuple(part.strip().encode() for part in h.split(":", 1)) for h in headers]
    answer = h2client.call(server.grpc_url, LIVE, body, metadata, wait=30)  # type: ignore[arg-type]
    assert answer.ended, answer
    return answer.fields


def _framed(message: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


def test_compressed_raw_messages_and_the_accepted_encodings(server: ServerProcess) -> None:
    """gzip and deflate (zlib) both decode; the answer advertises what the server accepts."""
    for encoding, compressed in (("gzip", gzip.compress(b"")), ("deflate", zlib.compress(b""))):
        fields = _curl_grpc(server, _framed(compressed, 1), f"grpc-encoding: {encoding}")
        assert fields["grpc-status"] == "0", fields
        assert {e.strip() for e in fields["grpc-accept-encoding"].split(",")} == {"identity", "deflate", "gzip"}


@pytest.mark.parametrize(
    ("headers", "flag", "status", "message"),
    [
        # grpc-core refuses an encoding it does not know while parsing the metadata
        (["grpc-encoding: snappy"], 1, "13", "Error parsing 'grpc-encoding' metadata"),
        ([], 1, "13", "Compression bit set but no encoding configured"),
        (["grpc-encoding: identity"], 1, "13", "Compression bit set but no encoding configured"),
        (["grpc-encoding: deflate"], 1, "13", "Decompression failed due to zlib error"),  # gzip bytes, not zlib
    ],
)
def test_requests_the_server_cannot_decode_are_refused(
    server: ServerProcess,
    client: grpcclient.InferenceServerClient,
    headers: list[str],
    flag: int,
    status: str,
    message: str,
) -> None:
    fields = _curl_grpc(server, _framed(gzip.compress(b""), flag), *headers)
    assert (fields["grpc-status"], fields.get("grpc-message")) == (status, message), fields
    _good(client)


# --------------------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize(
    ("timeout", "status", "message"),
    [
        ("10S", "0", None),
        # past gRPC's 8 digits, or larger than any clock: grpc-core serves the call without a deadline
        ("99999999H", "0", None),
        ("100000000S", "0", None),
        ("9999999999999999H", "0", None),
        ("99999999999999999999999H", "0", None),
        # not digits and a unit: grpc-core's refusal while parsing the metadata
        ("1x", "13", "Error parsing 'grpc-timeout' metadata"),
        ("abc", "13", "Error parsing 'grpc-timeout' metadata"),
        ("S", "13", "Error parsing 'grpc-timeout' metadata"),
    ],
)
def test_grpc_timeouts_as_grpc_core_reads_them(
    server: ServerProcess, client: grpcclient.InferenceServerClient, timeout: str, status: str, message: str | None
) -> None:
    answer = h2client.call(server.grpc_url, LIVE, h2client.framed(b""), [(b"grpc-timeout", timeout.encode())])
    assert answer.ended and (answer.status, answer.message or None) == (status, message), answer
    _good(client)


# ---------------------------------------------------------------------------------------- keepalive

PING, GOAWAY, CLOSED = 6, 7, -1


@pytest.mark.parametrize("transport", grpc_transports())
def test_keepalive_pings_a_quiet_connection_and_the_rust_transport_closes_it_unanswered(
    transport: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Triton's --grpc-keepalive-time / --grpc-keepalive-timeout: a connection with a call open and nothing else
    going on is PINGed after the keepalive time. Unanswered, the Rust transport (hyper) closes it after the
    keepalive timeout; grpc.aio did not close it within 15 s in our runs (grpc-core's watchdog), so the close is
    checked on the Rust transport only."""
    repo = tmp_path_factory.mktemp("keepalive") / "repo"
    repo.mkdir()
    flags = ["--grpc-keepalive-time", "1000", "--grpc-keepalive-timeout", "1000", "--grpc-transport", transport]
    s = start_server(repo, *flags)
    try:
        quiet = h2client.Quiet(s.grpc_url, "/inference.GRPCInferenceService/ModelStreamInfer")
        started = time.monotonic()
        frames = quiet.frames(wait=4 if transport == "grpcio" else 15)
        elapsed = time.monotonic() - started
        quiet.close()
        kinds = [kind for kind, flags in frames if not (kind == PING and flags & 1)]
        assert PING in kinds, frames
        if transport == "rust":
            assert kinds[-1] == CLOSED, frames
            assert elapsed < 6, (elapsed, frames)  # 1 s quiet, 1 s for the answer, then closed
    finally:
        assert s.terminate() == 0


# ---------------------------------------------------------------------------------- message sizes


def test_an_uncompressed_request_over_the_limit_is_refused(client: grpcclient.InferenceServerClient) -> None:
    values = np.ones(MAX // 4 + 100, np.float32)
    error = _refused(client.infer, "relu", [_input(values)])
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED", error
    assert error.message().startswith("SERVER: Received message larger than max (")
    assert error.message().endswith(f" vs. {MAX})"), error
    _good(client)


def test_a_response_over_the_limit_fails_the_call(client: grpcclient.InferenceServerClient) -> None:
    n = MAX // 4 // TILES + 100  # the request is ~6 KB, its response ~ MAX + 25 KB
    out = client.infer("tile", [_input(np.ones(n // 2, np.float32))]).as_numpy("OUT")  # under the limit: served
    assert out.shape == (n // 2 * TILES,)
    error = _refused(client.infer, "tile", [_input(np.ones(n, np.float32))])
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED", error
    assert error.message().startswith("SERVER: Sent message larger than max ("), error
    assert error.message().endswith(f" vs. {MAX})"), error
    _good(client)


def test_a_stream_response_over_the_limit_ends_the_stream(client: grpcclient.InferenceServerClient) -> None:
    n = MAX // 4 // TILES + 100
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tile", [_input(np.ones(8, np.float32))], request_id="small")
        result, error = results.get(timeout=60)
        assert error is None and result.as_numpy("OUT").shape == (8 * TILES,)
        client.async_stream_infer("tile", [_input(np.ones(n, np.float32))], request_id="big")
        _, error = results.get(timeout=60)
    finally:
        client.stop_stream()
    assert error is not None and error.status() == "StatusCode.RESOURCE_EXHAUSTED", error
    assert error.message().startswith("SERVER: Sent message larger than max ("), error
    _good(client)


def test_an_unknown_method_is_unimplemented(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")(b"", timeout=30)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------- back-pressure


def _executed(server: ServerProcess, model: str) -> int:
    return int(stats(server.base_url, model)["inference_stats"]["success"]["count"])


def test_a_stream_client_that_does_not_read_is_held_back(server: ServerProcess) -> None:
    """60 requests, each answered with ~60 KB; the client reads no answer. The server runs a few (the
    stream's inflight slots, the answers the transport holds, what HTTP/2 windows hold) and then stops
    reading the stream until the client reads; then every answer comes, in order."""
    count, n = 60, (MAX - 4096) // 4 // TILES
    before = _executed(server, "tile")

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for i in range(count):
            request = service_pb2.ModelInferRequest(model_name="tile", id=str(i))
            tensor = request.inputs.add(name="IN", datatype="FP32")
            tensor.shape.append(n)
            request.raw_input_contents.append(np.full(n, i, np.float32).tobytes())
            yield request

    # the client's window stays at HTTP/2's default (no BDP probing): its buffer is not what holds it back
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        answers = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        seen: list[int] = []

        def settled() -> bool:  # no request executed during the last second
            seen.append(_executed(server, "tile") - before)
            return len(seen) > 10 and seen[-1] > 0 and len(set(seen[-11:])) == 1

        wait_for("the stream to stop running requests", settled, interval=0.1, describe=lambda: seen[-11:])
        assert seen[-1] < count // 2, seen[-11:]
        replies = [next(answers) for _ in range(count)]
    assert [reply.error_message for reply in replies] == [""] * count
    assert [reply.infer_response.id for reply in replies] == [str(i) for i in range(count)]
