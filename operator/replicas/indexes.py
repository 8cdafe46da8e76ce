"""What each replica of an InferenceServer serves: its endpoints and their repository indexes.

A Service address reaches one random pod, so the operator reads every replica itself: the
EndpointSlices of the server's Service list the pods, and each pod's ``POST /v2/repository/index``
says which versions it serves and from which config. Readiness is judged on the *ready* endpoints
(a pod still loading its models is out of the Service and serves nobody); the not-ready ones are
read only when no replica is ready, to say why.

Index reads are the bulk of a resync, so one ``ReplicaClient`` (one connection pool, one TLS
context) serves them all and each endpoint's index is shared by every model for ``max_age``
seconds; concurrent readers of the same endpoint wait for one request instead of sending many.
Each answer is bounded in bytes and in time (``replica_http``): an endpoint whose answer is too large
or too slow is a replica that cannot be read. Which endpoints are read at all: ``pool_pods``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .replica_http import AnswerError, ReplicaClient
from .server_access import PLAIN, ServerAccess

Rows = list[dict[str, Any]]
#: cache entries beyond which endpoints unread for STALE_AFTER seconds are dropped
PRUNE_ABOVE = 256
STALE_AFTER = 600.0
#: bytes an index (or a poll request's) answer may have: a row is ~0.3-1 KB, so tens of thousands of versions
INDEX_MAX_BYTES = 16 << 20
#: seconds a whole index read may take (each connect or read within it: the reader's ``timeout``)
INDEX_DEADLINE = 10.0


@dataclass(frozen=True)
class Endpoint:
    url: str
    #: pod name (or the address when the slice names no pod)
    name: str
    ready: bool = True
    #: the uid of the pod the slice names (``targetRef`` of kind Pod), empty when it names none
    pod_uid: str = ""


def endpoints_from_slices(slices: Iterable[Mapping[str, Any]], port_name: str = "http") -> list[Endpoint]:
    """Endpoints of a Service's EndpointSlices that are not terminating, with the port named ``port_name``.

    ``conditions.ready`` unset counts as ready (the EndpointSlice API's rule).
    """
    found: dict[str, Endpoint] = {}
    for piece in slices:
        port = next((p.get("port") for p in piece.get("ports") or () if p.get("name") == port_name), None)
        if not port:
            continue
        ipv6 = piece.get("addressType") == "IPv6"
        for ep in piece.get("endpoints") or ():
            cond = ep.get("conditions") or {}
            addresses = ep.get("addresses") or ()
            if cond.get("terminating") or not addresses:
                continue
            host = f"[{addresses[0]}]" if ipv6 else addresses[0]
            url = f"http://{host}:{port}"
            ref = ep.get("targetRef") or {}
            name = ref.get("name") or addresses[0]
            pod_uid = str(ref.get("uid") or "") if ref.get("kind") == "Pod" else ""
            ready = cond.get("ready") is not False or (url in found and found[url].ready)
            found[url] = Endpoint(url, name, ready, pod_uid)
    return sorted(found.values(), key=lambda e: (e.name, e.url))


@dataclass(frozen=True)
class ReplicaIndex:
    """One replica's repository index (``rows``, and the same by model name), or why it could not be read."""

    endpoint: Endpoint
    rows: list[dict[str, Any]] | None
    error: str = ""
    by_model: Mapping[str, list[dict[str, Any]]] | None = None

    def rows_of(self, model: str) -> list[dict[str, Any]]:
        """This model's rows (looked up, not searched: a resync asks once per model of the index)."""
        if self.by_model is not None:
            return self.by_model.get(model, [])
        return [r for r in self.rows or () if r.get("name") == model]


def group_rows(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(str(row.get("name")), []).append(row)
    return out


@dataclass
class _Entry:
    """A replica's cached index: when it was read whole (``at``), and when models' rows came since (``fresh``)."""

    at: float
    rows: Rows | None
    error: str
    by_model: dict[str, Rows] | None
    fresh: dict[str, float] = field(default_factory=dict)


class IndexReader:
    """Reads ``POST /v2/repository/index`` with one pooled client and a short shared cache."""

    def __init__(
        self,
        timeout: float = 5.0,
        workdir: str | None = None,
        *,
        max_bytes: int = INDEX_MAX_BYTES,
        deadline: float = INDEX_DEADLINE,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.client = ReplicaClient(timeout)
        #: one client per distinct TLS set-up of the pools with spec.auth.tls (ServerAccess.tls_key)
        self._tls_clients: dict[str, ReplicaClient] = {}
        self.workdir = workdir
        self._cache: dict[str, _Entry] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.requests = 0  # for the benchmark

    def _lock(self, url: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(url, threading.Lock())

    def client_for(self, access: ServerAccess) -> ReplicaClient:
        """The pooled HTTP client for a pool's access (plain, or its TLS set-up): other reads share it."""
        if not access.tls_key:
            return self.client
        with self._guard:
            client = self._tls_clients.get(access.tls_key)
            if client is None:
                verify = access.ssl_context(self.workdir or "/tmp")
                client = ReplicaClient(self.timeout, verify)
                self._tls_clients[access.tls_key] = client
            return client

    def read(
        self, endpoint: Endpoint, max_age: float, access: ServerAccess = PLAIN, model: str | None = None
    ) -> ReplicaIndex:
        """The endpoint's index, at most ``max_age`` seconds old (failures are remembered as long); for ``model``,
        rows the replica sent for it since (``update``) count as fresh too."""
        url = access.url(endpoint.url)
        with self._lock(url):
            hit = self._cache.get(url)
            now = time.monotonic()
            if hit is not None and (
                now - hit.at <= max_age or (model is not None and now - hit.fresh.get(model, -1e18) <= max_age)
            ):
                return ReplicaIndex(endpoint, hit.rows, hit.error, hit.by_model)
            rows: list[dict[str, Any]] | None = None
            error = ""
            try:
                self.requests += 1
                answer = self.client_for(access).exchange(
                    "POST",
                    f"{url}/v2/repository/index",
                    json_body={},
                    headers=access.headers,
                    max_bytes=self.max_bytes,
                    deadline=self.deadline,
                )
                if not 200 <= answer.status < 300:
                    raise AnswerError(f"HTTPStatusError: the replica answered HTTP {answer.status}")
                data = answer.json()
                if not isinstance(data, list):
                    raise ValueError(f"expected a JSON list, got {type(data).__name__}")
                rows = [r for r in data if isinstance(r, dict)]
            except AnswerError as exc:
                error = str(exc)
            except ValueError as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            entry = _Entry(time.monotonic(), rows, error, None if rows is None else group_rows(rows))
            self._cache[url] = entry
        if len(self._cache) > PRUNE_ABOVE:
            self._prune()
        return ReplicaIndex(endpoint, entry.rows, entry.error, entry.by_model)

    def update(self, url: str, access: ServerAccess, rows: Mapping[str, Rows]) -> None:
        """Rows the replica at ``url`` just sent for some models (the answer to a poll request): fresh for
        those models, without reading the whole index again (at 1,000 models that is a 1,000-row answer)."""
        key = access.url(url)
        with self._lock(key):
            now = time.monotonic()
            entry = self._cache.get(key)
            if entry is None or entry.by_model is None:
                entry = self._cache[key] = _Entry(-1e18, [], "", {})  # nothing else about it is known
            assert entry.by_model is not None
            for name, found in rows.items():
                entry.by_model[name] = found
                entry.fresh[name] = now

    def _prune(self) -> None:
        """Forget endpoints not read for a while (pods come and go, and so do their addresses)."""
        cutoff = time.monotonic() - STALE_AFTER
        with self._guard:
            stale = [u for u, e in list(self._cache.items()) if max(e.at, *e.fresh.values(), -1e18) < cutoff]
            for url in stale:
                self._cache.pop(url, None)
                self._locks.pop(url, None)

    def forget(self, urls: Iterable[str]) -> None:
        """Drop cached indexes (after a write the next read must be fresh)."""
        with self._guard:
            for url in urls:
                self._cache.pop(url, None)

    def close(self) -> None:
        self.client.close()
        for client in self._tls_clients.values():
            client.close()
