"""The operator's per-model writes (finalizer, status, event) sent straight to the API server.

A bulk apply costs three writes per model, and their answers are never read. Through the generated API
methods each write pays for argument validation (pydantic's ``validate_call``) and a walk of the body to
serialize it, which together cost about as much CPU as the HTTP request itself (the profile of
``benchmarks/operator_scale.py --profile``). This sends the same request with what the client would use: its
urllib3 pool's connections (TLS, client certificates), its default headers, and the credential its
configuration gives (``auth_settings()``, which also runs a token refresh hook), in one HTTP/1.1 exchange per
write on a kept-alive connection (``lean_http``; through the configuration's proxy, urllib3's own request).
Every other call keeps the generated methods. A refused write raises the client's ``ApiException``
with the status, reason and body, as the generated methods do.

It relies on ``ApiClient.configuration``, ``.default_headers``, ``.rest_client.pool_manager`` and
``Configuration.auth_settings()``/``.host``: public attributes of the client, the same from 30 to 37
(constraints.txt pins the tested version); tests/unit/operator/test_lean_writes.py sends each write both ways
to one HTTP server and compares what arrived, so an upgrade that changes them fails there.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from . import lean_http

JSON = "application/json"


def send(
    client: ApiClient,
    method: str,
    path: str,
    body: Mapping[str, Any],
    content_type: str,
    timeout: tuple[float, float],
) -> None:
    """``method`` ``path`` with ``body`` as JSON; the answer is read and dropped (the connection goes back to
    the pool); ``timeout``: (connect, read) seconds, the caller's (``kube.REQUEST_TIMEOUT``). Raises
    ``ApiException`` for a status outside 2xx, urllib3's errors for the connection."""
    config = client.configuration
    headers = {**client.default_headers, "Accept": JSON, "Content-Type": content_type}
    bearer = config.auth_settings().get("BearerToken")
    if bearer and bearer.get("value"):
        headers[bearer["key"]] = bearer["value"]
    # anything orjson does not know (a client model) as the generated methods would send it
    data = orjson.dumps(body, default=client.sanitize_for_serialization, option=orjson.OPT_NON_STR_KEYS)
    manager = client.rest_client.pool_manager
    reason: str | None
    answer_headers: Mapping[str, str]
    if type(manager) is urllib3.PoolManager:
        # the host's kept-alive connections straight away (``lean_http``): the pool manager would parse the
        # URL, merge headers and look for a redirect again on every write, and urllib3 and http.client
        # would build the request and parse the answer's headers at several times the CPU of the exchange itself
        scheme, host, port, prefix = _origin(config.host)
        answer = _connections(manager, (scheme, host, port), config).request(
            method, prefix + path, headers, data, timeout
        )
        status, reason, answer_headers, text = answer.status, answer.reason, answer.headers, answer.body
        if 200 <= status <= 299:
            return
    else:  # a ProxyManager (the configuration's proxy): it decides how each URL is sent
        wait = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        response = manager.request(
            method, config.host + path, body=data, headers=headers, preload_content=False, timeout=wait
        )
        try:
            if 200 <= response.status <= 299:
                response.drain_conn()
                return
            text = response.read()
        finally:
            response.release_conn()
        status, reason, answer_headers = response.status, response.reason, response.headers
    refused = ApiException(status=status, reason=reason)
    refused.body = text.decode("utf-8", "replace")
    refused.headers = answer_headers
    raise refused


Origin = tuple[str, str, int | None]  # scheme, host, port
_connections_of: weakref.WeakKeyDictionary[urllib3.PoolManager, dict[Origin, lean_http.Connections]]
_connections_of = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _connections(manager: urllib3.PoolManager, origin: Origin, config: Configuration) -> lean_http.Connections:
    """The kept-alive connections to ``origin`` (scheme, host, port), made by ``manager``'s pool for it: one
    set per client (its pool manager), found without the manager's per-request URL and key work."""
    found = _connections_of.get(manager, {}).get(origin)
    if found is None:
        with _lock:
            by_origin = _connections_of.setdefault(manager, {})
            found = by_origin.get(origin)
            if found is None:
                pool = manager.connection_from_host(origin[1], origin[2], origin[0])
                found = by_origin[origin] = lean_http.Connections(pool, config.connection_pool_maxsize or 4)
    return found


@functools.lru_cache(maxsize=8)
def _origin(host: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path prefix) of the configuration's ``host`` URL (a proxy in front of the API
    server may put the cluster under a path, e.g. ``https://rancher/k8s/clusters/c-1``)."""
    url = urllib3.util.parse_url(host)
    return url.scheme or "http", url.host or "", url.port, (url.path or "").rstrip("/")


def segment(name: str) -> str:
    """One path segment (a namespace, a name), quoted."""
    return quote(name, safe="")
