"""The one HTTP client of every store: connections through the egress guard, hosts admitted per namespace.

S3 requests are signed with botocore and OCI requests carry the registry's token, but neither library
opens a connection: the signed request is sent by this client's httpcore pool, whose network backend is
``guard.GuardedBackend``. The ranged reads of large files (``direct=True``) go out on the same backend by
``direct.DirectGets`` (the standard library's ``http.client``), which reads bodies without httpcore's copies.
A redirect (a registry sends blob downloads to a CDN) is followed hop by hop, each hop admitted like the first,
and credentials are sent to the first hop's origin only.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import httpcore
import httpx

from .direct import DirectGets
from .egress import AddressPolicy, EgressRefused, HostRules, literal_address, normal_host
from .errors import REFUSED, UNAVAILABLE, SourceError
from .guard import GuardedBackend, Resolver, failure_phrase, system_resolve
from .transfer import RangeAnswer

MAX_REDIRECTS = 5
#: the largest body read whole (listings, manifests, tokens, error documents)
MAX_DOCUMENT = 8 << 20
log = logging.getLogger("kubeinfer.sources.client")

_ADDRESS_HINT = (
    "sources are fetched only from public addresses (a cluster admin may allow a network with the chart "
    "value artifacts.allowedNetworks)"
)


def shown(url: httpx.URL) -> str:
    """A URL for a message: no user info, query or fragment (signatures and tokens live there)."""
    port = f":{url.port}" if url.port else ""
    path = url.path if len(url.path) <= 200 else url.path[:200] + "..."
    return f"{url.scheme}://{url.host}{port}{path}"


@dataclass
class Answer:
    """A response whose body is still to be read (``stream``) or was read whole (``body``)."""

    status: int
    headers: dict[str, str]
    url: httpx.URL
    #: chunks of a ``direct`` answer are valid only until the next is asked for
    stream: Iterator[bytes | memoryview]

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def read(self, limit: int = MAX_DOCUMENT) -> bytes:
        out = bytearray()
        for chunk in self.stream:
            out += chunk
            if len(out) > limit:
                raise SourceError(UNAVAILABLE, f"{shown(self.url)} answered with more than {limit} bytes")
        return bytes(out)

    def ranged(self) -> RangeAnswer:
        """This answer as the downloader takes it (which checks its status and range)."""
        return RangeAnswer(self.status, self.headers.get("content-range", ""), self.stream)


class StoreClient:
    """An httpcore pool on the guarded backend, and the host rules of each namespace."""

    def __init__(
        self,
        policy: AddressPolicy | None = None,
        hosts: HostRules | None = None,
        *,
        timeout: float = 60.0,
        ca_file: str | None = None,
        resolve: Resolver = system_resolve,
        max_connections: int = 64,
    ) -> None:
        self.policy = policy or AddressPolicy()
        self.hosts = hosts or HostRules()
        self.timeout = timeout
        context = ssl.create_default_context(cafile=ca_file) if ca_file else httpcore.default_ssl_context()
        self.backend = GuardedBackend(self.policy, resolve)
        self.pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
            retries=0,
            network_backend=self.backend,
        )
        self.direct = DirectGets(self.backend, context)

    def close(self) -> None:
        self.pool.close()
        self.direct.close()

    def admit(self, url: httpx.URL, namespace: str, where: str) -> None:
        """The checks that need no connection: scheme, the namespace's hosts, an IP literal's class."""
        if url.scheme not in ("http", "https") or not url.host:
            raise SourceError(REFUSED, f"{where}: only http and https are spoken to stores")
        host = normal_host(url.host)
        if not self.hosts.allows(namespace, host):
            raise SourceError(
                REFUSED,
                f"{where}: host '{host}' is not among the hosts namespace '{namespace}' may download from "
                "(the operator's artifacts.allowedHosts)",
            )
        literal = literal_address(host)
        refused = self.policy.refusal(literal) if literal is not None else None
        if refused is not None:
            raise SourceError(REFUSED, f"{where}: '{host}' is a {refused} address; {_ADDRESS_HINT}")

    @contextlib.contextmanager
    def request(
        self,
        method: str,
        url: httpx.URL,
        headers: Mapping[str, str],
        *,
        namespace: str,
        where: str,
        follow: bool = False,
        body: bytes = b"",
        timeout: float | None = None,
        direct: bool = False,
    ) -> Iterator[Answer]:
        """Send one request (and follow up to MAX_REDIRECTS redirects when ``follow``); the answer streams.

        ``headers`` go to ``url``'s origin only: a redirect elsewhere is sent without them (a pre-signed
        location carries its own authorisation in its query). A request with a ``body`` (a token grant) is
        never redirected. ``timeout`` shortens the client's own for this request. ``direct``: a GET whose
        body is large (a ranged read of a file), sent by ``DirectGets``; its chunks are valid only until the
        next is read."""
        if body and follow:
            raise ValueError("a request with a body is not redirected")
        if direct and (method != "GET" or body):
            raise ValueError("only a GET without a body is sent directly")
        limit = min(timeout, self.timeout) if timeout else self.timeout
        first = url
        try:
            for hop in range(MAX_REDIRECTS + 1):
                self.admit(url, namespace, where)
                own = (url.scheme, url.host, url.port) == (first.scheme, first.host, first.port)
                sent = [(b"Host", url.netloc), (b"Accept-Encoding", b"identity"), (b"User-Agent", b"kubeinfer")]
                if own:
                    sent += [(k.encode(), v.encode()) for k, v in headers.items() if k.lower() != "host"]
                with self._exchange(method, url, sent, body, limit, direct) as (status, got, stream):
                    location = got.get("location")
                    if follow and status in (301, 302, 303, 307, 308) and location:
                        nxt = url.join(location)
                        if nxt.scheme not in ("http", "https") or (url.scheme == "https" and nxt.scheme != "https"):
                            raise SourceError(REFUSED, f"{where}: a redirect to {nxt.scheme}:// is not followed")
                        url, where = nxt, f"redirect {hop + 1} of {where}"
                        continue
                    yield Answer(status, got, url, stream)
                    return
            raise SourceError(UNAVAILABLE, f"{shown(first)} redirects more than {MAX_REDIRECTS} times")
        except EgressRefused as exc:
            raise SourceError(REFUSED, f"{where}: {exc.message}; {_ADDRESS_HINT}") from None
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            log.info("request to %s failed: %r", shown(url), exc)
            raise SourceError(UNAVAILABLE, f"{shown(url)}: {failure_phrase(exc, limit)}") from None
        except httpcore.UnsupportedProtocol:
            raise SourceError(REFUSED, f"{shown(url)}: the scheme is not supported") from None

    @contextlib.contextmanager
    def _exchange(
        self, method: str, url: httpx.URL, sent: list[tuple[bytes, bytes]], body: bytes, limit: float, direct: bool
    ) -> Iterator[tuple[int, dict[str, str], Iterator[bytes | memoryview]]]:
        """One hop: the status, the headers (names lower-cased) and the body still to read."""
        if direct:
            with self.direct.get(url, sent, limit) as reply:
                yield reply.status, reply.headers, reply.chunks
            return
        extensions = {"timeout": dict.fromkeys(("connect", "read", "write", "pool"), limit)}
        with self.pool.stream(method, str(url).encode(), headers=sent, content=body, extensions=extensions) as response:
            got = {k.decode("latin-1").lower(): v.decode("latin-1").strip() for k, v in response.headers}
            yield response.status, got, response.iter_stream()
