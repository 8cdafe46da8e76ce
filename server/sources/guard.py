"""Connections a tenant's source may cause: public addresses only, each checked where it is made, all bounded in time.

Built on httpcore's public network-backend interface: a pool asks ``GuardedBackend`` for every TCP
connection, and the backend resolves the name once, checks every address it got
(``egress.AddressPolicy``), and connects to exactly such an address. So a redirect hop, a name that
resolves to a private address, and DNS rebinding (a second lookup answering differently) all meet the
same check, at the one place a connection is made. Every scheme's downloader (https, S3, OCI registries,
the Hugging Face Hub) sends its requests through a pool built on this backend, in the operator and in the
server alike, so no store client opens a socket of its own.

``deadline_scope`` bounds a whole exchange: every connect, TLS handshake, read and write of the thread
ends by the deadline, whatever the per-operation timeouts say.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpcore

from .egress import AddressPolicy, EgressRefused, IPAddress, literal_address, normal_host

log = logging.getLogger("kubeinfer.sources.guard")

_local = threading.local()


@contextlib.contextmanager
def deadline_scope(at: float) -> Iterator[None]:
    """Every connect, TLS handshake and read of this thread ends by monotonic time ``at``."""
    before = getattr(_local, "deadline", None)
    _local.deadline = at
    try:
        yield
    finally:
        _local.deadline = before


def current_deadline() -> float | None:
    """This thread's deadline (monotonic time), for work it hands to other threads."""
    at: float | None = getattr(_local, "deadline", None)
    return at


@contextlib.contextmanager
def same_deadline(at: float | None) -> Iterator[None]:
    """``deadline_scope(at)``, or nothing when there is no deadline to carry over."""
    if at is None:
        yield
    else:
        with deadline_scope(at):
            yield


def clamp(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of the thread's deadline (a past deadline: a timeout at once)."""
    at: float | None = getattr(_local, "deadline", None)
    if at is None:
        return timeout
    left = max(0.001, at - time.monotonic())
    return left if timeout is None else min(timeout, left)


class Unresolvable(httpcore.ConnectError):
    """The host name has no address."""


class GuardedStream(httpcore.NetworkStream):
    """A connection whose reads, writes and TLS handshake obey the thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, clamp(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, clamp(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return GuardedStream(self._inner.start_tls(ssl_context, server_hostname, clamp(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


Resolver = Callable[[str, int], list[IPAddress]]


def system_resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for ``host``, in its order, without duplicates."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Unresolvable(f"{host} does not resolve") from exc
    out: list[IPAddress] = []
    for info in infos:
        address = literal_address(str(info[4][0]).split("%")[0])
        if address is not None and address not in out:
            out.append(address)
    return out


class GuardedBackend(httpcore.NetworkBackend):
    """Resolve once, refuse if any address breaks the policy, connect to exactly a checked address.

    ``exempt`` is the configured proxy's (host, port): connections to it are not checked.
    """

    def __init__(
        self,
        policy: AddressPolicy,
        resolve: Resolver = system_resolve,
        exempt: tuple[str, int] | None = None,
        inner: httpcore.NetworkBackend | None = None,
    ) -> None:
        self.policy = policy
        self.resolve = resolve
        self.exempt = exempt
        self.inner = inner or httpcore.SyncBackend()
        #: (host, address) of every connection made, for the tests and the logs
        self.connected: list[tuple[str, str]] = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = clamp(timeout)
        if self.exempt is not None and (normal_host(host), port) == self.exempt:
            return GuardedStream(self.inner.connect_tcp(host, port, timeout, local_address, socket_options))
        literal = literal_address(host)
        addresses = [literal] if literal is not None else self.resolve(host, port)
        if not addresses:
            raise Unresolvable(f"{host} has no address")
        for address in addresses:
            refused = self.policy.refusal(address)
            if refused is not None:
                log.info("refused a connection to %s (%s): %s", host, address, refused)
                what = f"'{host}' is" if literal is not None else f"host '{host}' resolves to"
                raise EgressRefused("address", f"{what} a {refused} address")
        error: Exception | None = None
        for address in addresses:
            try:
                stream = self.inner.connect_tcp(str(address), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:  # the next address, as socket.create_connection would
                error = exc
                continue
            if len(self.connected) < 10_000:
                self.connected.append((host, str(address)))
            return GuardedStream(stream)
        assert error is not None
        raise error

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise EgressRefused("address", "downloads over unix sockets are not allowed")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def failure_phrase(exc: Exception, timeout: float) -> str:
    """A fixed phrase per kind of failure: never the exception's text (it may quote the remote)."""
    if isinstance(exc, Unresolvable):
        return "the host name does not resolve"
    if isinstance(exc, httpcore.ConnectTimeout):
        return f"connecting took longer than {timeout:g} s"
    if isinstance(exc, httpcore.ReadTimeout):
        return f"the server sent nothing for {timeout:g} s"
    if isinstance(exc, httpcore.WriteTimeout):
        return f"the server took no data for {timeout:g} s"
    if isinstance(exc, httpcore.ProxyError):
        return "the download proxy refused the request"
    if isinstance(exc, httpcore.ConnectError):
        # httpcore wraps the socket's error as the first argument (the pool re-raises "from None")
        causes = [exc.__cause__, exc.__context__, *exc.args]
        if any(isinstance(c, ssl.SSLCertVerificationError) for c in causes):
            return "the server's TLS certificate is not trusted (see the operator's --fetch-ca-file)"
        if any(isinstance(c, ssl.SSLError) for c in causes):
            return "the TLS handshake failed"
        return "the connection could not be made"
    if isinstance(exc, httpcore.RemoteProtocolError):
        return "the server's answer is not valid HTTP"
    if isinstance(exc, httpcore.UnsupportedProtocol):
        return "the URL's scheme is not supported"
    return "the connection broke off"
