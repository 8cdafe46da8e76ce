"""A bulk GET whose body is read with ``readinto`` into one reused buffer, on a guarded connection.

Why not the httpcore pool: h11 copies every body byte four times (into its receive buffer, two slices, then
``bytes``) in 64 KiB reads, which made the download cost ~1.9x the CPU of boto3's; on a 2-core machine that is
the throughput. This sends the request with the standard library's ``http.client``, which also parses the
answer (status line, headers, Content-Length, chunks, keep-alive), and reads the body with
``HTTPResponse.readinto`` into a buffer of its own: a read that large goes straight from the socket into the
buffer, so each byte is copied once, by the kernel. It is used only for the ranged reads of large files (S3
and OCI); everything else (listings, tokens, documents) stays on the pool.

What it keeps: every connection comes from ``StoreClient.backend`` (``guard.GuardedBackend``: the addresses
are checked where the connection is made; TLS by the same backend's ``start_tls``), and every send and every
``recv_into`` obeys the thread's deadline (``guard.clamp``, applied per socket call, so a server that drips a
byte at a time cannot outlast it). Failures are httpcore's exceptions, so the caller maps them as it maps the
pool's. Idle connections are kept for reuse per origin (a TLS handshake per part would cost round trips),
dropped when the server closed them, after ``KEEPALIVE`` seconds, or when an answer was not read to its end.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from .guard import clamp

#: bytes read per ``readinto``: large enough that the per-chunk Python work is small, small enough per thread
BUFFER = 256 << 10
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


class _Reads(io.RawIOBase):
    """The socket's ``recv_into``, each call under the timeout cut to the thread's deadline."""

    def __init__(self, guarded: _Socket) -> None:
        self.guarded = guarded

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.guarded.sock.settimeout(clamp(self.guarded.timeout))
        return self.guarded.sock.recv_into(buffer)


class _Socket:
    """What ``http.client`` uses of its socket (``sendall``, ``makefile``, ``close``), under the deadline.

    ``makefile`` gives a buffered reader over ``_Reads``: the status line and headers are read through its
    small buffer, and a body read larger than that buffer goes to the socket directly. ``close`` leaves the
    socket open: ``http.client`` closes its side before the body of a close-delimited answer is read, and
    ``DirectGets`` closes the socket itself once the answer is done with."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.timeout: float | None = None

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(clamp(self.timeout))
        self.sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reads(self))

    def close(self) -> None:
        pass


class _Connection(http.client.HTTPConnection):
    """An ``HTTPConnection`` whose ``connect`` takes its socket from the guarded backend (and its TLS)."""

    def __init__(self, backend: httpcore.NetworkBackend, ssl_context: ssl.SSLContext, origin: Origin) -> None:
        scheme, host, port = origin
        super().__init__(host, port)
        self.backend = backend
        self.ssl_context = ssl_context if scheme == "https" else None
        self.stream: httpcore.NetworkStream | None = None
        self.guarded: _Socket | None = None
        self.timeout_s: float | None = None

    def connect(self) -> None:
        stream = self.backend.connect_tcp(self.host, self.port, self.timeout_s)
        if self.ssl_context is not None:
            try:
                stream = stream.start_tls(self.ssl_context, server_hostname=self.host, timeout=self.timeout_s)
            except BaseException:
                stream.close()
                raise
        self.stream = stream
        self.guarded = _Socket(stream.get_extra_info("socket"))
        self.guarded.timeout = self.timeout_s
        self.sock = self.guarded

    def set_timeout(self, timeout: float) -> None:
        self.timeout_s = timeout
        if self.guarded is not None:
            self.guarded.timeout = timeout

    def stale(self) -> bool:
        """Closed by the server (readable at EOF), or never connected."""
        return self.stream is None or bool(self.stream.get_extra_info("is_readable"))

    def drop(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self.stream = self.guarded = None
        self.sock = None


class DirectGets:
    """Idle connections per origin, and ``get``: one request on one of them (or a fresh, guarded one)."""

    def __init__(self, backend: httpcore.NetworkBackend, ssl_context: ssl.SSLContext) -> None:
        self.backend = backend
        self.ssl_context = ssl_context
        self._idle: dict[Origin, list[tuple[float, _Connection]]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for _, connection in connections:
                connection.drop()

    def _connect(self, origin: Origin, timeout: float) -> _Connection:
        with self._lock:
            connections = self._idle.get(origin, [])
            while connections:
                since, connection = connections.pop()
                if time.monotonic() - since < KEEPALIVE and not connection.stale():
                    connection.set_timeout(timeout)
                    return connection
                connection.drop()  # closed by the server, or idle too long
        connection = _Connection(self.backend, self.ssl_context, origin)
        connection.set_timeout(timeout)
        connection.connect()
        return connection

    def _keep(self, origin: Origin, connection: _Connection) -> None:
        with self._lock:
            connections = self._idle.setdefault(origin, [])
            if len(connections) < MAX_IDLE:
                connections.append((time.monotonic(), connection))
                return
        connection.drop()

    @contextlib.contextmanager
    def get(self, url: httpx.URL, headers: Sequence[tuple[bytes, bytes]], timeout: float) -> Iterator[Reply]:
        """GET ``url`` with ``headers`` (Host included by the caller); the reply, its body still to read."""
        port = url.port or (443 if url.scheme == "https" else 80)
        origin = (url.scheme, url.host, port)
        connection = self._connect(origin, timeout)
        reusable = False
        try:
            try:
                connection.putrequest("GET", url.raw_path.decode("ascii"), skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    connection.putheader(name, value)
                connection.endheaders()
            except (ValueError, http.client.HTTPException) as exc:  # a header or path with a line break
                raise httpcore.LocalProtocolError(str(exc)) from exc
            except TimeoutError as exc:
                raise httpcore.WriteTimeout(str(exc)) from exc
            except OSError as exc:
                raise httpcore.WriteError(str(exc)) from exc
            with _reading():
                response = connection.getresponse()
            body = _Body(response)
            fields = {name.lower(): value.strip() for name, value in response.getheaders()}
            yield Reply(response.status, fields, iter(body))
            reusable = body.complete and not response.will_close
        finally:
            if reusable:
                self._keep(origin, connection)
            else:
                connection.drop()


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    """``http.client``'s and the socket's failures while reading an answer, as httpcore's exceptions."""
    try:
        yield
    except TimeoutError as exc:
        raise httpcore.ReadTimeout(str(exc)) from exc
    except (http.client.RemoteDisconnected, http.client.IncompleteRead) as exc:
        raise httpcore.ReadError(str(exc)) from exc
    except http.client.HTTPException as exc:
        raise httpcore.RemoteProtocolError(str(exc)) from exc
    except OSError as exc:
        raise httpcore.ReadError(str(exc)) from exc


class _Body:
    """The body, ``readinto`` one reused buffer until the answer ends."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.response = response
        self.complete = False

    def __iter__(self) -> Iterator[bytes | memoryview]:
        view = memoryview(bytearray(BUFFER))
        while True:
            with _reading():
                n = self.response.readinto(view)
            if n == 0:
                break
            yield view[:n]
        if self.response.length:  # http.client ends a Content-Length body cut short without an error
            raise httpcore.ReadError("the server closed the connection within the body")
        self.complete = True
