"""Download credentials from a Secret, only for the Secret's own hosts.

Whoever may create an InferenceModel names ``source.credentialsSecret``; without a host binding they
could send a labelled Secret (another team's, in their namespace by RBAC mistake, or their own
platform's) to any URL. The Secret itself says where it may go, so naming it cannot widen that.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from kubeinfer.server.sources.egress import check_pattern, matches_any

from .artifacts import ArtifactError

#: Secrets the operator may use as download credentials carry this label (set to "true")
CREDENTIALS_LABEL = "serving.kubeinfer.io/artifact-credentials"
#: ... and this annotation: the hosts they may be sent to, comma-separated (``*.example.com`` allowed)
HOSTS_ANNOTATION = "serving.kubeinfer.io/artifact-hosts"


def secret_hosts(secret: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """The host patterns a credentials Secret names (ArtifactError when it names none, or a bad one)."""
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    raw = str(annotations.get(HOSTS_ANNOTATION) or "")
    try:
        patterns = tuple(check_pattern(p) for p in raw.split(",") if p.strip())
    except ValueError as exc:
        raise ArtifactError("CredentialsRejected", f"Secret '{name}': annotation {HOSTS_ANNOTATION}: {exc}") from None
    if not patterns:
        raise ArtifactError(
            "CredentialsRejected",
            f"Secret '{name}' names no hosts: annotate it with {HOSTS_ANNOTATION}: \"models.example.com,...\" "
            "(the hosts its credentials may be sent to)",
        )
    if "*" in patterns:
        raise ArtifactError(
            "CredentialsRejected", f"Secret '{name}': {HOSTS_ANNOTATION} must name hosts, not '*' (any host)"
        )
    return patterns


def credential_data(secret: Mapping[str, Any], name: str, host: str) -> dict[str, str]:
    """The decoded data of a Secret the user named in ``source.credentialsSecret``, for a download from ``host``.

    The Secret must be labelled ``serving.kubeinfer.io/artifact-credentials: "true"`` (so naming a
    Secret cannot make the operator send one that was never meant for downloads) and annotated with the
    hosts it may be sent to (``serving.kubeinfer.io/artifact-hosts``, which must match ``host``).
    """
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(CREDENTIALS_LABEL) != "true":
        raise ArtifactError(
            "CredentialsRejected",
            f"Secret '{name}' is not labelled {CREDENTIALS_LABEL}=true; label it to allow its use for downloads",
        )
    if not matches_any(host, secret_hosts(secret, name)):
        raise ArtifactError(
            "CredentialsRejected",
            f"Secret '{name}' may not be sent to '{host}': that host is not in its annotation {HOSTS_ANNOTATION}",
        )
    return {k: base64.b64decode(v).decode("utf-8", "replace").strip() for k, v in (secret.get("data") or {}).items()}


def headers_from(data: Mapping[str, str], name: str) -> dict[str, str]:
    """HTTP headers from checked Secret data: ``token`` (sent as ``Authorization: Bearer``), ``username``
    and ``password`` (Basic), or ``authorization`` (the header's full value)."""
    if data.get("authorization"):
        return {"Authorization": data["authorization"]}
    if data.get("token"):
        return {"Authorization": f"Bearer {data['token']}"}
    if "username" in data and "password" in data:
        pair = base64.b64encode(f"{data['username']}:{data['password']}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    raise ArtifactError(
        "CredentialsRejected",
        f"Secret '{name}' has none of the keys token, username+password, authorization",
    )


def credential_headers(secret: Mapping[str, Any], name: str, host: str) -> dict[str, str]:
    """HTTP headers from a credentials Secret for a download from ``host`` (``credential_data``, ``headers_from``)."""
    return headers_from(credential_data(secret, name, host), name)
