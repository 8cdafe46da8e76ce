"""The operator's per-model writes (finalizer, status, event) sent straight to the API server.

A bulk apply costs three writes per model, and their answers are never read. Through the generated API
methods each write pays for argument validation (pydantic's ``validate_call``) and a walk of the body to
serialize it, which together cost about as much CPU as the HTTP request itself (the profile of
``benchmarks/operator_scale.py --profile``). This sends the same request with what the client would use: its
urllib3 pool's connections (TLS, client certificates), its default headers, and the credential its
configuration gives (``auth_settings()``, which also runs a token refresh hook), each write one urllib3 request
on the client's own kept-alive connections (urllib3's public ``connection_from_host`` and ``urlopen``; through
the configuration's proxy, the pool manager's ``request``). Every other call keeps the generated methods. A
refused write raises the client's ``ApiException`` with the status, reason and body, as the generated methods
do. No HTTP is written by hand: a write costs urllib3's request building and answer parsing, as every other
call does.

It relies on ``ApiClient.configuration``, ``.default_headers``, ``.rest_client.pool_manager`` and
``Configuration.auth_settings()``/``.host``: public attributes of the client, the same from 30 to 37
(constraints.txt pins the tested version); tests/unit/operator/test_lean_writes.py sends each write both ways
to one HTTP server and compares what arrived, so an upgrade that changes them fails there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

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
    wait = _timeout(timeout)
    if type(manager) is urllib3.PoolManager:
        # the host's pool straight away: the pool manager would parse the URL, merge its headers and look up
        # the pool again on every write
        scheme, host, port, prefix = _origin(config.host)
        pool = manager.connection_from_host(host, port, scheme)
        response = pool.urlopen(method, prefix + path, body=data, headers=headers, timeout=wait)
    else:  # a ProxyManager (the configuration's proxy): it decides how each URL is sent
        response = manager.request(method, config.host + path, body=data, headers=headers, timeout=wait)
    # the answer was read whole (``preload_content``) and its connection went back to the pool
    if 200 <= response.status <= 299:
        return
    refused = ApiException(status=response.status, reason=response.reason)
    refused.body = response.data.decode("utf-8", "replace")
    refused.headers = response.headers
    raise refused


@functools.lru_cache(maxsize=8)
def _timeout(seconds: tuple[float, float]) -> urllib3.Timeout:
    """One ``Timeout`` per (connect, read) pair, built once: the pool clones it for each request."""
    return urllib3.Timeout(connect=seconds[0], read=seconds[1])


@functools.lru_cache(maxsize=8)
def _origin(host: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path prefix) of the configuration's ``host`` URL (a proxy in front of the API
    server may put the cluster under a path, e.g. ``https://rancher/k8s/clusters/c-1``)."""
    url = urllib3.util.parse_url(host)
    return url.scheme or "http", url.host or "", url.port, (url.path or "").rstrip("/")


def segment(name: str) -> str:
    """One path segment (a namespace, a name), quoted."""
    return quote(name, safe="")
