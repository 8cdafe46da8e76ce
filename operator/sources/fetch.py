"""Downloads of an http(s) ``source.uri``: public addresses only, bounded in bytes and time, no oracles.

Every connection goes through ``kubeinfer.server.sources.guard`` (the one egress guard of every source
scheme). httpcore never decodes a ``Content-Encoding``, so the bytes counted against the size limit are
the bytes received.

With ``--fetch-proxy`` the proxy is the address connected to (the operator's own setting, not
checked); the operator still checks the scheme, the host allow-lists and URL hosts that are IP
literals, but cannot see which address the proxy resolves a name to: the proxy must refuse
non-public destinations itself.

Status messages name the rule and the host or address class, never the resolved address, the
remote's error text or the body's digest: a tenant must not be able to read anything through them.
Blocking I/O by design (kopf runs the handlers in worker threads).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import httpcore
import httpx
from kubeinfer.server.sources.egress import AddressPolicy, EgressRefused, HostRules, literal_address, normal_host
from kubeinfer.server.sources.guard import (
    GuardedBackend,
    Resolver,
    deadline_scope,
    failure_phrase,
    system_resolve,
)

from .artifacts import ArtifactError, Digest, copy_chunks
from .credentials import headers_from
from .quota import DownloadGate, NamespaceQuota

#: redirects followed per download (each checked: http(s) only, never from https down to http)
MAX_REDIRECTS = 5
SCHEMES = ("http", "https")
DEFAULT_TIMEOUT = 60.0
DEFAULT_DEADLINE = 1800.0
#: Content-Encoding values named in a refusal; anything else is "an encoding" (remote text is not echoed)
KNOWN_ENCODINGS = {"gzip", "x-gzip", "deflate", "br", "compress", "zstd", "identity"}
log = logging.getLogger("kubeinfer.operator.sources.fetch")


def shown(url: httpx.URL) -> str:
    """A URL for a status message: no user info, query or fragment (pre-signed tokens live there)."""
    port = f":{url.port}" if url.port else ""
    path = url.path if len(url.path) <= 200 else url.path[:200] + "..."
    return f"{url.scheme}://{url.host}{port}{path}"


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def _parse(uri: str) -> httpx.URL:
    try:
        url = httpx.URL(uri)
    except (httpx.InvalidURL, TypeError):
        raise ArtifactError("SchemeRejected", "source.uri is not a valid URL") from None
    if url.scheme not in SCHEMES or not url.host:
        raise ArtifactError("SchemeRejected", "source.uri must be an http:// or https:// URL with a host")
    return url


def uri_host(uri: str) -> str:
    """The host of ``uri`` as the host rules and credentials see it ("" when it does not parse)."""
    try:
        return normal_host(httpx.URL(uri).host)
    except (httpx.InvalidURL, TypeError):
        return ""


class Fetcher:
    """One connection pool for every download, and the rules every download obeys."""

    def __init__(
        self,
        policy: AddressPolicy | None = None,
        hosts: HostRules | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        proxy: str | None = None,
        ca_file: str | None = None,
        resolve: Resolver = system_resolve,
    ) -> None:
        self.policy = policy or AddressPolicy()
        self.hosts = hosts or HostRules()
        self.timeout = timeout
        self.deadline = deadline
        self.proxy = proxy
        self.ca_file = ca_file
        self.resolve = resolve
        context = ssl.create_default_context(cafile=ca_file) if ca_file else httpcore.default_ssl_context()
        exempt = None
        if proxy:
            purl = httpx.URL(proxy)
            exempt = (normal_host(purl.host), purl.port or (443 if purl.scheme == "https" else 80))
        self.backend = GuardedBackend(self.policy, resolve, exempt)
        self.pool = httpcore.ConnectionPool(
            ssl_context=context,
            proxy=httpcore.Proxy(proxy) if proxy else None,
            max_connections=64,
            max_keepalive_connections=8,
            keepalive_expiry=30.0,
            retries=0,
            network_backend=self.backend,
        )

    def close(self) -> None:
        self.pool.close()

    def precheck(self, uri: str, namespace: str) -> None:
        """The refusals that need no connection (scheme, host lists, IP literals), before a download slot
        is taken: a refused URI must not wait for, or hold, one of its namespace's slots."""
        self._admit(_parse(uri), namespace, "source.uri")

    def _admit(self, url: httpx.URL, namespace: str, where: str) -> None:
        """The checks made before a request: scheme, the namespace's hosts, an IP literal's class."""
        host = normal_host(url.host)
        if not self.hosts.allows(namespace, host):
            raise ArtifactError(
                "HostNotAllowed",
                f"{where}: host '{host}' is not among the hosts namespace '{namespace}' may download from "
                "(the operator's artifacts.allowedHosts)",
            )
        literal = literal_address(host)
        refused = self.policy.refusal(literal) if literal is not None else None
        if refused is not None:
            raise ArtifactError("AddressRefused", f"{where}: '{host}' is a {refused} address; {_ADDRESS_HINT}")

    def download(
        self,
        uri: str,
        sha256: str,
        out: BinaryIO,
        *,
        namespace: str = "",
        max_bytes: int,
        headers: Mapping[str, str] | None = None,
        cancelled: Callable[[], bool] | None = None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> int:
        """Stream ``uri`` into ``out``; ArtifactError on any refusal, failure, oversize or checksum mismatch.

        Only http(s); redirects are followed up to MAX_REDIRECTS, never to another scheme and never from
        https to http, each hop checked like the first; ``headers`` (credentials) go to the uri's own
        origin only. ``cancelled`` is polled between chunks; ``on_bytes`` sees every chunk's size (the
        namespace quota) and may raise to stop.
        """
        if not sha256:
            raise ArtifactError("ChecksumRequired", "a remote source needs source.sha256")
        first = url = _parse(uri)
        if headers and url.scheme != "https":
            raise ArtifactError("CredentialsRejected", f"credentials are only sent over https, not to {shown(url)}")
        started = time.monotonic()
        digest = hashlib.sha256()
        where = "source.uri"
        try:
            with deadline_scope(started + self.deadline):
                for hop in range(MAX_REDIRECTS + 1):
                    self._admit(url, namespace, where)
                    own = (url.scheme, url.host, url.port) == (first.scheme, first.host, first.port)
                    with self._get(url, headers if own else None) as response:
                        nxt = self._redirect(url, response)
                        if nxt is None:
                            size = self._receive(url, response, out, digest, started, max_bytes, cancelled, on_bytes)
                            break
                    url, where = nxt, f"redirect {hop + 1} of source.uri"
                else:
                    raise ArtifactError("FetchFailed", f"{shown(first)} redirects more than {MAX_REDIRECTS} times")
        except EgressRefused as exc:
            raise ArtifactError("AddressRefused", f"{where}: {exc.message}; {_ADDRESS_HINT}") from None
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, httpcore.ProxyError) as exc:
            log.info("download of %s failed: %r", shown(url), exc)
            self._check_deadline(started)
            raise ArtifactError(
                "FetchFailed", f"cannot download {shown(url)}: {failure_phrase(exc, self.timeout)}"
            ) from None
        except httpcore.UnsupportedProtocol:
            raise ArtifactError("SchemeRejected", f"{shown(url)}: the scheme is not supported") from None
        if digest.hexdigest() != sha256.lower():
            log.info("%s: sha256 %s, source.sha256 %s", shown(first), digest.hexdigest(), sha256)
            raise ArtifactError(
                "ChecksumMismatch",
                f"the file downloaded from {shown(first)} does not have the sha256 in source.sha256; "
                "fix source.sha256 or source.uri",
            )
        return size

    def _get(
        self, url: httpx.URL, headers: Mapping[str, str] | None
    ) -> contextlib.AbstractContextManager[httpcore.Response]:
        sent = [(b"Host", url.netloc), (b"Accept-Encoding", b"identity"), (b"User-Agent", b"kubeinfer-operator")]
        sent += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        target = httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path)
        extensions = {"timeout": dict.fromkeys(("connect", "read", "write", "pool"), self.timeout)}
        return self.pool.stream("GET", target, headers=sent, extensions=extensions)

    @staticmethod
    def _redirect(url: httpx.URL, response: httpcore.Response) -> httpx.URL | None:
        """Where a redirect leads (checked: http(s) only, never down from https), None for other answers."""
        if response.status not in (301, 302, 303, 307, 308):
            return None
        try:
            nxt = url.join(_header(response.headers, b"location") or "")
        except (httpx.InvalidURL, TypeError):
            raise ArtifactError("RedirectRejected", f"{shown(url)} redirects to an invalid URL") from None
        if nxt.scheme not in SCHEMES or (url.scheme == "https" and nxt.scheme != "https"):
            raise ArtifactError(
                "RedirectRejected",
                f"{shown(url)} redirects from {url.scheme}:// to {nxt.scheme}://, which the operator refuses",
            )
        return nxt

    def _receive(
        self,
        url: httpx.URL,
        response: httpcore.Response,
        out: BinaryIO,
        digest: Digest,
        started: float,
        max_bytes: int,
        cancelled: Callable[[], bool] | None,
        on_bytes: Callable[[int], None] | None,
    ) -> int:
        """The body of a final answer into ``out``: 200 only, no content coding, within the limits."""
        if response.status != 200:
            raise ArtifactError("FetchFailed", f"GET {shown(url)} returned HTTP {response.status}; check source.uri")
        encoding = (_header(response.headers, b"content-encoding") or "identity").lower()
        if encoding != "identity":
            named = f"'{encoding}'" if encoding in KNOWN_ENCODINGS else "a content encoding"
            raise ArtifactError(
                "EncodingRefused",
                f"{shown(url)} was sent with {named} although the operator asks for the file as is "
                "(Accept-Encoding: identity); serve it uncompressed, without Content-Encoding",
            )
        declared = _header(response.headers, b"content-length") or ""
        if declared.isdigit() and int(declared) > max_bytes:
            raise ArtifactError(
                "TooLarge", f"{shown(url)} is {declared} bytes, over the operator's limit of {max_bytes} bytes"
            )

        def on_chunk(nbytes: int) -> None:
            self._check_deadline(started)
            if on_bytes is not None:
                on_bytes(nbytes)

        # as received: the deadline and cancellation are checked often
        return copy_chunks(
            response.iter_stream(),
            out.write,
            digest,
            copy=f"download of {shown(url)}",
            source=shown(url),
            max_bytes=max_bytes,
            cancelled=cancelled,
            on_chunk=on_chunk,
        )

    def _check_deadline(self, started: float) -> None:
        if time.monotonic() - started >= self.deadline:
            raise ArtifactError(
                "DeadlineExceeded",
                f"the download did not finish within the operator's limit of {self.deadline:g} s per download",
            )


_ADDRESS_HINT = (
    "the operator downloads only from public addresses (a cluster admin may allow a network with the "
    "chart value artifacts.allowedNetworks)"
)


@dataclass
class Fetch:
    """Per-sync fetch context: a credentials Secret's data for a (Secret, host), cancellation, the namespace's download
    slot (taken at the first download, held until ``finish``) and its quota."""

    credentials: Callable[[str, str], dict[str, str]] | None = None
    cancelled: Callable[[], bool] | None = None
    gate: DownloadGate | None = None
    quota: NamespaceQuota | None = None

    def __post_init__(self) -> None:
        self._slot: str | None = None
        self._written: dict[str, int] = {}
        #: (version, bytes, seconds) of each artifact this sync fetched, in order (a cold start's fetch phase)
        self.fetched: list[tuple[int, int, float]] = []
        #: version -> what pinned the content a store served (``oci-digest sha256:...``), for the status
        self.served: dict[int, str] = {}

    def headers(self, secret: str, uri: str) -> dict[str, str]:
        return headers_from(self.secret_data(secret, uri_host(uri)), secret)

    def secret_data(self, secret: str, host: str) -> dict[str, str]:
        """The credentials Secret's data, when its annotation allows ``host`` (ArtifactError otherwise)."""
        if self.credentials is None:
            raise ArtifactError("CredentialsRejected", f"no Secret lookup available for credentialsSecret '{secret}'")
        return self.credentials(secret, host)

    def take_slot(self, namespace: str) -> None:
        """A download slot of ``namespace`` for the rest of this sync (ArtifactError 'Queued' if none is free)."""
        if self.gate is not None and self._slot is None:
            self.gate.acquire(namespace)
            self._slot = namespace

    def check_quota(self, namespace: str, more: int = 0) -> None:
        if self.quota is not None:
            self.quota.check(namespace, more)

    def count(self, namespace: str, nbytes: int) -> None:
        """Bytes written to staging for ``namespace``: charged to its quota (QuotaExceeded past it)."""
        if self.quota is not None:
            self.quota.add(namespace, nbytes)
            self._written[namespace] = self._written.get(namespace, 0) + nbytes

    def finish(self, succeeded: bool) -> None:
        """Release the slot; bytes staged by a failed sync were removed with its staging."""
        if self.gate is not None and self._slot is not None:
            self.gate.release(self._slot)
            self._slot = None
        if self.quota is not None and not succeeded:
            for namespace, nbytes in self._written.items():
                self.quota.forget(namespace, nbytes)
        self._written.clear()
