"""The lean writes' HTTP/1.1 exchange (operator/kube/lean_http.py) against real sockets: answers framed each way
HTTP allows (length, chunks with extensions and trailers, end of stream, interim 100), kept-alive
connections reused and, when the server closed one while it was idle, the request sent again on a new one;
broken answers and silence are urllib3's errors (what ``kube.transient`` retries); TLS with a client
certificate goes through the client's own urllib3 pool (the private ``_new_conn`` it relies on)."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import urllib3
from kubeinfer.operator.kube import lean_http, lean_writes
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from tests.support.https import make_ca_and_cert

#: what a scripted server answers to the n-th request on a connection: raw bytes, and whether to close after
#: (True), or to reset the connection after them ("reset": SO_LINGER 0, an RST instead of a FIN)
Script = Callable[[int, bytes], tuple[bytes, bool | str]]


class RawServer:
    """Accepts connections; reads each request (headers and Content-Length body) and writes what ``script``
    says, byte for byte. Records each request and the connection it came on."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.requests: list[tuple[int, bytes]] = []  # (connection number, request bytes)
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.tls = tls
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            buf, served = b"", 0
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                request, buf = head + b"\r\n\r\n" + buf[:length], buf[length:]
                self.requests.append((number, request))
                answer, close = self.script(served, request)
                served += 1
                conn.sendall(answer)
                if close == "reset":
                    time.sleep(0.3)  # the client reads what was sent first (an RST can drop unread data)
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                if close:
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(script, tls))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def ok(body: bytes = b'{"kind":"Status"}', extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def connections(server: RawServer, scheme: str = "http") -> lean_http.Connections:
    pool = urllib3.PoolManager().connection_from_host("127.0.0.1", server.port, scheme)
    return lean_http.Connections(pool, keep=2)


def post(conns: lean_http.Connections, body: bytes = b"{}", timeout: float = 5) -> lean_http.Answer:
    return conns.request(
        "POST", "/api/v1/namespaces/ns/events", {"Content-Type": "application/json"}, body, (5, timeout)
    )


def test_answers_framed_each_way_are_read_whole_and_the_connection_kept(serve: Callable[..., RawServer]) -> None:
    chunked = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after")
    answers = [ok(b"first"), chunked, interim, b"HTTP/1.1 204 No Content\r\n\r\n", ok(b"last")]
    server = serve(lambda n, _: (answers[n], False))
    conns = connections(server)
    got = [post(conns) for _ in answers]
    assert [(a.status, a.body) for a in got] == [
        (200, b"first"),
        (201, b"hello world"),
        (200, b"after"),
        (204, b""),
        (200, b"last"),
    ]
    assert got[1].reason == "Created" and got[0].headers["content-type"] == "application/json"
    assert server.connections == 1 and conns.opened == 1  # one kept-alive connection carried all five


def test_the_request_arrives_as_written(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda n, _: (ok(), False))
    conns = connections(server)
    conns.request("PATCH", "/apis/g/v1/x/m/status", {"Authorization": "Bearer t", "Accept": "a/b"}, b'{"a":1}', (5, 5))
    request = server.requests[0][1]
    assert request == (
        b"PATCH /apis/g/v1/x/m/status HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer t\r\nAccept: a/b\r\n"
        b'Content-Length: 7\r\n\r\n{"a":1}' % server.port
    )


def test_an_answer_ended_by_closing_and_connection_close_are_not_reused(serve: Callable[..., RawServer]) -> None:
    answers = [
        (b"HTTP/1.1 200 OK\r\n\r\nno length, ends with the stream", True),
        (ok(b"x", b"Connection: close\r\n"), True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\ny", True),
        (ok(b"z"), False),
    ]
    seen = iter(answers)
    server = serve(lambda n, _: next(seen))
    conns = connections(server)
    assert [post(conns).body for _ in answers] == [b"no length, ends with the stream", b"x", b"y", b"z"]
    assert server.connections == 4


def test_a_connection_closed_while_idle_is_replaced_and_the_request_sent_once(serve: Callable[..., RawServer]) -> None:
    # the server answers and then closes, without saying so: the next request finds the stream ended
    server = serve(lambda n, _: (ok(b"%d" % n), True))
    conns = connections(server)
    assert post(conns).body == b"0"
    assert post(conns, b'{"second":1}').body == b"0"  # a new connection's first answer
    assert [r.endswith(b'{"second":1}') for _, r in server.requests] == [False, True]
    assert conns.opened == 2


def test_a_new_connection_closed_without_an_answer_is_a_protocol_error(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda n, _: (b"", True))
    with pytest.raises(ProtocolError, match="without answering"):
        post(connections(server))
    assert len(server.requests) == 1  # a new connection: not sent again


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "malformed status line"),
        (b"SPDY/3 200 OK\r\n\r\n", "malformed status line"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "malformed Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        # int(x, 16) takes these; a negative size once moved the reader backwards for ever
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\nabcdef\r\n0\r\n\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+2\r\nab\r\n0\r\n\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nab", "malformed Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "does not end with CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed the connection in the middle"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (lean_http.MAX_HEAD + 10), "longer than"),
    ],
)
def test_a_broken_answer_is_a_protocol_error(serve: Callable[..., RawServer], answer: bytes, match: str) -> None:
    server = serve(lambda n, _: (answer, True))
    with pytest.raises(ProtocolError, match=match):
        post(connections(server))


def test_a_reset_after_part_of_an_answer_is_not_sent_again(serve: Callable[..., RawServer]) -> None:
    """On a reused connection, a reset before any byte of the answer resends (the server closed it while it was
    idle); a reset after some of it does not: the server had the request."""
    answers: list[tuple[bytes, bool | str]] = [
        (ok(b"first"), False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart", "reset"),
    ]
    server = serve(lambda n, _: answers[n])
    conns = connections(server)
    assert post(conns).body == b"first"
    with pytest.raises(ProtocolError):
        post(conns, b'{"second":1}')
    assert [r.endswith(b'{"second":1}') for _, r in server.requests] == [False, True]  # sent once
    assert server.connections == 1


def test_silence_is_a_read_timeout(serve: Callable[..., RawServer]) -> None:
    hold = threading.Event()
    server = serve(lambda n, _: (hold.wait(5) and b"", True))
    with pytest.raises(ReadTimeoutError):
        post(connections(server), timeout=0.3)
    hold.set()


def test_a_header_value_with_a_line_break_is_refused_before_sending(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda n, _: (ok(), False))
    with pytest.raises(ValueError, match="line break"):
        connections(server).request("POST", "/", {"Authorization": "Bearer a\r\nX-Injected: 1"}, b"", (5, 5))
    assert server.requests == []


def _client_cert_server(tmp_path: Path) -> tuple[ssl.SSLContext, Path, Path, Path]:
    ca, cert, key = make_ca_and_cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    ctx.verify_mode = ssl.CERT_REQUIRED  # the client must show a certificate of the same CA
    ctx.load_verify_locations(str(ca))
    return ctx, ca, cert, key


def test_tls_with_a_client_certificate_goes_through_the_clients_pool(
    serve: Callable[..., RawServer], tmp_path: Path
) -> None:
    """The kubeconfig's CA and client certificate reach the lean writes through urllib3's ``_new_conn``."""
    ctx, ca, cert, key = _client_cert_server(tmp_path)
    server = serve(lambda n, _: (ok(), False), tls=ctx)
    config = Configuration()
    config.host = f"https://127.0.0.1:{server.port}"
    config.ssl_ca_cert, config.cert_file, config.key_file = str(ca), str(cert), str(key)
    client = ApiClient(config)
    for i in range(3):
        lean_writes.send(client, "POST", "/api/v1/namespaces/ns/events", {"n": i}, lean_writes.JSON, (5, 5))
    assert [r.endswith(b'{"n":%d}' % i) for i, (_, r) in enumerate(server.requests)] == [True] * 3
    assert server.connections == 1

    without = Configuration()
    without.host, without.ssl_ca_cert = config.host, str(ca)  # no client certificate: the server refuses
    with pytest.raises((ProtocolError, urllib3.exceptions.HTTPError)):
        lean_writes.send(ApiClient(without), "POST", "/x", {}, lean_writes.JSON, (5, 5))

    untrusted = Configuration()
    untrusted.host = config.host  # the system's CAs: the test CA is not among them
    with pytest.raises(urllib3.exceptions.HTTPError):
        lean_writes.send(ApiClient(untrusted), "POST", "/x", {}, lean_writes.JSON, (5, 5))


def test_a_refusal_carries_the_answers_status_reason_and_body(serve: Callable[..., RawServer]) -> None:
    body = b'{"kind":"Status","code":422,"message":"bad"}'
    answer = b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    server = serve(lambda n, _: (answer, False))
    config = Configuration()
    config.host = f"http://127.0.0.1:{server.port}"
    with pytest.raises(ApiException) as refused:
        lean_writes.send(ApiClient(config), "POST", "/x", {}, lean_writes.JSON, (5, 5))
    assert refused.value.status == 422 and refused.value.reason == "Unprocessable Entity"
    assert refused.value.body == body.decode()
