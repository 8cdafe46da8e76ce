"""One HTTP/1.1 exchange on a kept-alive connection to the API server, for writes whose answer is dropped.

The operator's per-model writes (``lean_writes``: finalizer, status, event) are three requests per model
created. urllib3 and ``http.client`` build each request through header validation and parse each answer's
headers with the ``email`` package, and h11's state machine costs about as much: each took well over the
socket and TLS work itself in client CPU (README, "At scale"). What is left here is that work: the request is
one ``sendall`` of bytes built with one f-string, and the answer is read for its status, its framing headers
and its body (``Content-Length`` or chunked), which is then dropped.

What is not hand-written: each connection is made by the client's own urllib3 pool (``_new_conn``, then the
public ``connect()``), so TLS (CA, client certificate, ``tls_server_name``, ``assert_hostname``, socket
options) is exactly what every other API call of the operator uses. A configuration with a proxy never comes
here (``lean_writes`` keeps urllib3 for it). ``_new_conn`` is urllib3's private method: constraints.txt pins
the version tested, and tests/unit/operator/test_lean_http.py connects through it to a TLS server that
requires the client's certificate, so a change that breaks it fails there.

Failures are urllib3's errors (``ProtocolError``, a ``urllib3.exceptions.HTTPError``) so that the callers'
retry rule (``kube.transient``) sees a broken connection as it did before. A request sent on a kept-alive
connection the server closed while it was idle (end of stream or a reset before any byte of an answer) is
sent once more on a new connection: nothing of it was answered, and the three writes are safe to repeat (two
are merge patches; a repeated event is a duplicate line in ``kubectl describe`` at worst).
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Mapping
from typing import Any

import urllib3
from urllib3.exceptions import ProtocolError

#: an answer's status line and headers larger than this are refused (the API server's are ~300 bytes)
MAX_HEAD = 64 * 1024
#: an answer's body larger than this is refused (it is read only to keep the connection usable)
MAX_BODY = 64 * 1024 * 1024
_CHUNK = 65536
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class Answer:
    """The parts of an answer the writes use: the status, its reason, the headers (names lower-cased) and the
    body (read whole, so that the connection can carry the next request)."""

    __slots__ = ("status", "reason", "headers", "body")

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status, self.reason, self.headers, self.body = status, reason, headers, body


class _Closed(Exception):
    """The connection ended before the first byte of an answer (a kept-alive one the server closed idle)."""


class _Reader:
    """Buffered reads of one answer from ``sock``."""

    __slots__ = ("sock", "buf", "pos")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.pos = sock, b"", 0

    def _more(self) -> None:
        data = self.sock.recv(_CHUNK)
        if not data:
            raise ProtocolError("the API server closed the connection in the middle of an answer")
        self.buf = self.buf[self.pos :] + data
        self.pos = 0

    def until(self, end: bytes, what: str) -> bytes:
        """The bytes up to ``end`` (consumed, not returned); ``what`` names them when they are too long."""
        while True:
            found = self.buf.find(end, self.pos)
            if found >= 0:
                data, self.pos = self.buf[self.pos : found], found + len(end)
                return data
            if len(self.buf) - self.pos > MAX_HEAD:
                raise ProtocolError(f"{what} is longer than {MAX_HEAD} bytes")
            self._more()

    def line(self) -> bytes:
        return self.until(b"\r\n", "a chunk size or trailer line")

    def exactly(self, n: int) -> bytes:
        if n > MAX_BODY:
            raise ProtocolError(f"an answer's body is larger than {MAX_BODY} bytes")
        while len(self.buf) - self.pos < n:
            self._more()
        data, self.pos = self.buf[self.pos : self.pos + n], self.pos + n
        return data

    def chunked(self) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = self.line().split(b";", 1)[0].strip(b" \t")
            # hex digits only: int() would also take a sign, a 0x prefix or underscores (-6 looped for ever)
            if not _HEX.fullmatch(size_line):
                raise ProtocolError(f"a malformed chunk size {size_line[:40]!r}")
            size = int(size_line, 16)
            if size == 0:
                while self.line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise ProtocolError(f"an answer's body is larger than {MAX_BODY} bytes")
            parts.append(self.exactly(size))
            if self.exactly(2) != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")

    def rest(self) -> bytes:
        """Everything up to the end of the stream (an answer framed by closing the connection)."""
        parts = [self.buf[self.pos :]]
        total = len(parts[0])
        while data := self.sock.recv(_CHUNK):
            total += len(data)
            if total > MAX_BODY:
                raise ProtocolError(f"an answer's body is larger than {MAX_BODY} bytes")
            parts.append(data)
        return b"".join(parts)


def _read_answer(sock: socket.socket, method: str) -> tuple[Answer, bool]:
    """(the answer, whether the connection can carry another request). Raises ``_Closed`` when the stream
    ended or was reset before any byte of it; a reset after some of it is a ProtocolError (the request
    reached the server: it must not be sent again)."""
    reader = _Reader(sock)
    try:
        reader._more()
    except (ProtocolError, ConnectionError):
        raise _Closed() from None
    try:
        return _parse_answer(reader, method)
    except ConnectionError as exc:
        raise ProtocolError(f"the connection to the API server failed in the middle of an answer: {exc}") from exc


def _parse_answer(reader: _Reader, method: str) -> tuple[Answer, bool]:
    while True:
        head = reader.until(b"\r\n\r\n", "an answer's status line and headers")
        status_line, _, rest = head.partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"a malformed status line {status_line[:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200 and status != 101:
            continue  # 100 Continue and other interim answers: the final one follows
        break
    headers: dict[str, str] = {}
    for raw in rest.split(b"\r\n") if rest else ():
        name, sep, value = raw.partition(b":")
        if not sep:
            raise ProtocolError(f"a malformed header line {raw[:80]!r}")
        key = name.strip().decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    keep = parts[0] == b"HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if method == "HEAD" or status in (204, 304):
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = reader.chunked()
    elif "content-length" in headers:
        if not headers["content-length"].isdigit() or not headers["content-length"].isascii():
            raise ProtocolError(f"a malformed Content-Length {headers['content-length'][:40]!r}")
        body = reader.exactly(int(headers["content-length"]))
    else:
        body, keep = reader.rest(), False
    if reader.pos != len(reader.buf):
        keep = False  # bytes after the answer: nothing this client asked for; do not reuse the stream
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    return Answer(status, reason, headers, body), keep


def _header_value(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError("a header value with a line break (a token or header from the configuration?)")
    return value


class Connections:
    """Kept-alive connections to one origin, made by ``pool`` (the client's urllib3 pool for it), shared by
    the threads that write; at most ``keep`` idle ones are kept."""

    def __init__(self, pool: urllib3.HTTPConnectionPool, keep: int) -> None:
        self.pool = pool
        self.keep = max(1, keep)
        default_port = 443 if pool.scheme == "https" else 80
        host = f"[{pool.host}]" if ":" in pool.host else pool.host
        self.host = host if pool.port in (None, default_port) else f"{host}:{pool.port}"
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self.opened = 0

    def _connect(self, connect_timeout: float) -> socket.socket:
        conn: Any = self.pool._new_conn()  # urllib3's own TLS set-up (see the module's docstring)
        conn.timeout = connect_timeout
        try:
            conn.connect()
        except OSError as exc:
            raise urllib3.exceptions.NewConnectionError(conn, f"could not connect to the API server: {exc}") from exc
        sock: socket.socket | None = conn.sock
        if sock is None:  # connect() always sets it
            raise ProtocolError("urllib3 connected without a socket")
        self.opened += 1
        return sock

    def _take(self) -> socket.socket | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, Any],
        body: bytes,
        timeout: tuple[float, float],
    ) -> Answer:
        """Send one request and read its whole answer; ``timeout``: (connect, read) seconds."""
        lines = "".join(f"{k}: {_header_value(str(v))}\r\n" for k, v in headers.items())
        data = f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\n{lines}Content-Length: {len(body)}\r\n\r\n"
        data_bytes = data.encode("latin-1") + body
        sock = self._take()
        reused = sock is not None
        while True:
            if sock is None:
                sock = self._connect(timeout[0])
            try:
                sock.settimeout(timeout[1])
                sock.sendall(data_bytes)
                answer, keep = _read_answer(sock, method)
            except BaseException as exc:
                sock.close()
                if reused and isinstance(exc, (_Closed, ConnectionError)):
                    sock, reused = None, False  # closed while it was idle: once more on a new connection
                    continue
                if isinstance(exc, _Closed):
                    raise ProtocolError("the API server closed a new connection without answering") from None
                if isinstance(exc, TimeoutError):
                    raise urllib3.exceptions.ReadTimeoutError(
                        self.pool, target, f"the API server did not answer in {timeout[1]} s"
                    ) from exc
                if isinstance(exc, OSError):  # a reset, a TLS failure
                    raise ProtocolError(f"the connection to the API server failed: {exc}") from exc
                raise  # a malformed answer's ProtocolError, an interrupt
            if keep:
                self._give_back(sock)
            else:
                sock.close()
            return answer
