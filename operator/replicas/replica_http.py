"""Every answer the operator reads from a server replica, bounded in bytes and in time.

The operator asks each replica for its repository index, for a model's statistics, for its start-up
timeline, and to poll models now. A replica is a pod: a broken one, or a pod posing as one, could answer
with an endless or enormous body, or a byte at a time. Read whole and waited on per read (an HTTP client's
usual timeout), such an answer makes the operator hold all of it in memory (and be OOM-killed, again after
each restart) or wait on it without end. So every exchange here has

* a size cap: a declared ``Content-Length`` over it is refused before the body is read, and the body is read
  in chunks and dropped as soon as it passes the cap;
* a deadline for the whole exchange (connect, TLS handshake, sending, the answer's head and its body),
  enforced on every socket operation (``fetch.deadline_scope``: each read waits at most until the deadline),
  so a byte-a-second drip ends at the deadline, not a read timeout later;
* no content coding: the operator asks for ``Accept-Encoding: identity`` and refuses any other, so the bytes
  counted are the bytes received (a small compressed answer cannot inflate past the cap).

A refused answer is an ``AnswerError``, which callers treat like an unreachable replica. Built on
httpcore's public connection pool and network-backend interface (as ``fetch``), one pool per TLS set-up.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
from kubeinfer.server.sources.guard import GuardedStream, clamp, deadline_scope

#: connections kept per pool (the operator reads many replicas at once from its worker threads)
MAX_CONNECTIONS = 100
MAX_KEEPALIVE = 20
KEEPALIVE_SECONDS = 5.0
#: transport failures: an unreachable, refusing or misbehaving replica
TRANSPORT_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
    OSError,  # TLS failures (ssl.SSLError) included
)


class AnswerError(Exception):
    """No usable answer: unreachable, too large, too slow, or coded. The message says which."""


class TooLarge(AnswerError):
    pass


class TooSlow(AnswerError):
    pass


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not (nesting too deep to decode included)."""
        try:
            return json.loads(self.body)
        except RecursionError:
            raise ValueError("the answer's JSON is nested too deeply") from None


class DeadlineBackend(httpcore.NetworkBackend):
    """Plain TCP connections whose connect, reads, writes and TLS handshake end by the thread's deadline."""

    def __init__(self, inner: httpcore.NetworkBackend | None = None) -> None:
        self.inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        return GuardedStream(self.inner.connect_tcp(host, port, clamp(timeout), local_address, socket_options))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        return GuardedStream(self.inner.connect_unix_socket(path, clamp(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class ReplicaClient:
    """One connection pool (plain, or one TLS set-up) for the operator's calls to replicas.

    ``timeout``: the longest a single connect, send or read may wait (within the exchange's deadline).
    """

    def __init__(self, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        self.pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=MAX_CONNECTIONS,
            max_keepalive_connections=MAX_KEEPALIVE,
            keepalive_expiry=KEEPALIVE_SECONDS,
            retries=0,
            network_backend=DeadlineBackend(),
        )

    def exchange(
        self,
        method: str,
        url: str,
        *,
        max_bytes: int,
        deadline: float,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        timeout: float | None = None,
    ) -> Answer:
        """Send the request and read the whole answer: at most ``max_bytes`` of body, all within ``deadline``
        seconds from now. Any status is returned (the caller judges it); AnswerError when there is no answer
        within the limits."""
        at = time.monotonic() + deadline
        sent = [(b"Accept-Encoding", b"identity"), (b"User-Agent", b"kubeinfer-operator")]
        sent += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
        content = None
        if json_body is not None:
            content = json.dumps(json_body).encode()
            sent.append((b"Content-Type", b"application/json"))
        per_step = min(self.timeout if timeout is None else timeout, deadline)
        extensions = {"timeout": dict.fromkeys(("connect", "read", "write", "pool"), per_step)}
        try:
            with (
                deadline_scope(at),
                self.pool.stream(method, url, headers=sent, content=content, extensions=extensions) as response,
            ):
                return Answer(response.status, _body(response, max_bytes, at, deadline))
        except TRANSPORT_ERRORS as exc:
            if time.monotonic() >= at:
                raise TooSlow(_too_slow(deadline)) from None
            raise AnswerError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None

    def close(self) -> None:
        self.pool.close()


def _body(response: httpcore.Response, max_bytes: int, at: float, deadline: float) -> bytes:
    """The answer's body as received: no content coding, at most ``max_bytes``, by monotonic time ``at``."""
    headers = {k.lower(): v for k, v in response.headers}
    encoding = headers.get(b"content-encoding", b"identity").strip().lower()
    if encoding != b"identity":
        raise AnswerError("EncodingRefused: the answer is content-coded although the operator asks for identity")
    declared = headers.get(b"content-length", b"").strip()
    if declared.isdigit() and int(declared) > max_bytes:
        raise TooLarge(f"AnswerTooLarge: the answer declares {int(declared)} bytes, over {_limit(max_bytes)}")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_stream():
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"AnswerTooLarge: the answer goes on past {_limit(max_bytes)}")
        if time.monotonic() >= at:
            raise TooSlow(_too_slow(deadline))
        chunks.append(chunk)
    return b"".join(chunks)


def _limit(max_bytes: int) -> str:
    return f"the operator's limit of {max_bytes} bytes for it"


def _too_slow(deadline: float) -> str:
    return f"AnswerTooSlow: no complete answer within the operator's limit of {deadline:g} s for it"
