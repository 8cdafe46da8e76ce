"""The operator's per-model writes (finalizer, status, event) sent straight through the API client's own pool.

A bulk apply costs three writes per model, and their answers are never read. Through the generated API
methods each write pays for argument validation (pydantic's ``validate_call``) and a walk of the body to
serialize it, which together cost about as much CPU as the HTTP request itself (the profile of
``benchmarks/operator_scale.py --profile``). This sends the same request with what the client would use: its
urllib3 pool (TLS, client certificates, proxy), its default headers, and the credential its configuration
gives (``auth_settings()``, which also runs a token refresh hook). Every other call keeps the generated
methods. A refused write raises the client's ``ApiException`` with the status, reason and body, as the
generated methods do.

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
    wait = urllib3.Timeout(connect=timeout[0], read=timeout[1])
    manager = client.rest_client.pool_manager
    if type(manager) is urllib3.PoolManager:
        # the host's pool straight away: the pool manager would parse the URL, merge headers and look for a
        # redirect again on every write (~10% of a write's CPU); the API server does not redirect writes
        scheme, host, port, prefix = _origin(config.host)
        pool = manager.connection_from_host(host, port, scheme)
        response = pool.urlopen(
            method, prefix + path, body=data, headers=headers, preload_content=False, timeout=wait, redirect=False
        )
    else:  # a ProxyManager (the configuration's proxy): it decides how each URL is sent
        response = manager.request(
            method, config.host + path, body=data, headers=headers, preload_content=False, timeout=wait
        )
    try:
        if 200 <= response.status <= 299:
            response.drain_conn()
            return
        text = response.read().decode("utf-8", "replace")
    finally:
        response.release_conn()
    refused = ApiException(status=response.status, reason=response.reason)
    refused.body = text
    refused.headers = response.headers
    raise refused


@functools.lru_cache(maxsize=8)
def _origin(host: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path prefix) of the configuration's ``host`` URL (a proxy in front of the API
    server may put the cluster under a path, e.g. ``https://rancher/k8s/clusters/c-1``)."""
    url = urllib3.util.parse_url(host)
    return url.scheme or "http", url.host or "", url.port, (url.path or "").rstrip("/")


def segment(name: str) -> str:
    """One path segment (a namespace, a name), quoted."""
    return quote(name, safe="")
