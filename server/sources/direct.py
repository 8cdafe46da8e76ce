"""A bulk GET whose body is read with ``recv_into`` into one reused buffer, on a guarded connection.

Why not the httpcore pool: h11 copies every body byte four times (into its receive buffer, two slices, then
``bytes``) in 64 KiB reads, which made the download cost ~1.9x the CPU of boto3's; on a 2-core machine that is
the throughput. This sends one HTTP/1.1 request and reads the answer's body straight into a buffer of its own,
chunk by chunk, so each byte is copied once, by the kernel. It is used only for the ranged reads of large
files (S3 and OCI); everything else (listings, tokens, documents) stays on the pool.

What it keeps: every connection comes from ``StoreClient.backend`` (``guard.GuardedBackend``: the addresses
are checked where the connection is made) and every read, write and handshake obeys the thread's deadline
(``guard.clamp``). Failures are httpcore's exceptions, so the caller maps them as it maps the pool's. Idle
connections are kept for reuse per origin (a TLS handshake per part would cost round trips), dropped when
the server closed them, after ``KEEPALIVE`` seconds, or when an answer was not read to its end.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpcore
import httpx

from .guard import clamp

#: bytes read per ``recv_into``: large enough that the per-chunk Python work is small, small enough per thread
BUFFER = 256 << 10
MAX_HEAD = 64 << 10
KEEPALIVE = 30.0
#: idle connections kept per origin
MAX_IDLE = 16

Origin = tuple[str, str, int]


@dataclass
class Reply:
    status: int
    #: header names lower-cased (the last of repeated ones)
    headers: dict[str, str]
    #: the body: each chunk is valid only until the next is asked for (the buffer is reused)
    chunks: Iterator[bytes | memoryview]


class DirectGets:
    """Idle connections per origin, and ``get``: one request on one of them (or a fresh, guarded one)."""

    def __init__(self, backend: httpcore.NetworkBackend, ssl_context: ssl.SSLContext) -> None:
        self.backend = backend
        self.ssl_context = ssl_context
        self._idle: dict[Origin, list[tuple[float, httpcore.NetworkStream]]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for streams in idle.values():
            for _, stream in streams:
                stream.close()

    def _connect(self, origin: Origin, timeout: float) -> httpcore.NetworkStream:
        scheme, host, port = origin
        with self._lock:
            streams = self._idle.get(origin, [])
            while streams:
                since, stream = streams.pop()
                if time.monotonic() - since < KEEPALIVE and not stream.get_extra_info("is_readable"):
                    return stream
                stream.close()  # closed by the server (readable at EOF), or idle too long
        stream = self.backend.connect_tcp(host, port, timeout)
        if scheme == "https":
            try:
                stream = stream.start_tls(self.ssl_context, server_hostname=host, timeout=timeout)
            except BaseException:
                stream.close()
                raise
        return stream

    def _keep(self, origin: Origin, stream: httpcore.NetworkStream) -> None:
        with self._lock:
            streams = self._idle.setdefault(origin, [])
            if len(streams) < MAX_IDLE:
                streams.append((time.monotonic(), stream))
                return
        stream.close()

    @contextlib.contextmanager
    def get(self, url: httpx.URL, headers: Sequence[tuple[bytes, bytes]], timeout: float) -> Iterator[Reply]:
        """GET ``url`` with ``headers`` (Host included by the caller); the reply, its body still to read."""
        for name, value in headers:
            if any(c in name + value for c in b"\r\n\0"):
                raise httpcore.LocalProtocolError("a header holds a line break")
        port = url.port or (443 if url.scheme == "https" else 80)
        origin = (url.scheme, url.host, port)
        stream = self._connect(origin, timeout)
        reusable = False
        try:
            lines = [b"GET " + url.raw_path + b" HTTP/1.1", *(name + b": " + value for name, value in headers)]
            stream.write(b"\r\n".join(lines) + b"\r\n\r\n", timeout)
            head = bytearray()
            while (end := head.find(b"\r\n\r\n")) < 0:
                if len(head) > MAX_HEAD:
                    raise httpcore.RemoteProtocolError("the answer's headers are too long")
                got = stream.read(MAX_HEAD, timeout)
                if not got:
                    raise httpcore.ReadError("the server closed the connection before answering")
                head += got
            status, fields = _parse_head(bytes(head[:end]))
            rest = bytes(head[end + 4 :])
            if "transfer-encoding" in fields:
                raise httpcore.RemoteProtocolError("a chunked answer to a bulk GET")
            length = int(fields["content-length"]) if "content-length" in fields else None
            if status < 200 or status in (204, 304):
                length = 0  # no body, whatever the headers say
            body = _Body(stream.get_extra_info("socket"), rest, length, timeout)
            yield Reply(status, fields, iter(body))
            reusable = (
                body.complete
                and length is not None
                and len(rest) <= length  # nothing sent past the body
                and fields.get("connection", "").lower() != "close"
            )
        finally:
            if reusable:
                self._keep(origin, stream)
            else:
                stream.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    first, *lines = head.decode("latin-1").split("\r\n")
    parts = first.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise httpcore.RemoteProtocolError("the answer's status line is not HTTP/1.x")
    fields: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise httpcore.RemoteProtocolError("an answer header is malformed")
        fields[name.lower()] = value.strip()
    if "content-length" in fields and not fields["content-length"].isdigit():
        raise httpcore.RemoteProtocolError("the answer's Content-Length is not a number")
    return int(parts[1]), fields


class _Body:
    """The body's bytes: those read with the headers, then ``recv_into`` one buffer up to the length."""

    def __init__(self, sock: socket.socket, first: bytes, length: int | None, timeout: float) -> None:
        self.sock = sock
        self.first = first if length is None else first[:length]
        self.length = length
        self.timeout = timeout
        self.complete = False

    def __iter__(self) -> Iterator[bytes | memoryview]:
        left = None if self.length is None else self.length - len(self.first)
        if self.first:
            yield self.first
        view = memoryview(bytearray(BUFFER))
        while left is None or left > 0:
            try:
                self.sock.settimeout(clamp(self.timeout))
                n = self.sock.recv_into(view, BUFFER if left is None else min(left, BUFFER))
            except TimeoutError as exc:
                raise httpcore.ReadTimeout(str(exc)) from exc
            except OSError as exc:
                raise httpcore.ReadError(str(exc)) from exc
            if n == 0:
                if left is None:  # no Content-Length: the body ends where the connection does
                    break
                raise httpcore.ReadError("the server closed the connection within the body")
            if left is not None:
                left -= n
            yield view[:n]
        self.complete = True
