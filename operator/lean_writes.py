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

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

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
    response = client.rest_client.pool_manager.request(
        method,
        config.host + path,
        # anything JSON does not know (a datetime, a client model) as the generated methods would send it
        body=json.dumps(body, separators=(",", ":"), default=client.sanitize_for_serialization).encode(),
        headers=headers,
        preload_content=False,
        timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
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


def segment(name: str) -> str:
    """One path segment (a namespace, a name), quoted."""
    return quote(name, safe="")
