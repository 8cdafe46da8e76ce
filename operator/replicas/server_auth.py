"""``InferenceServer.spec.auth`` → what the server pods mount and the flags that turn auth and TLS on. Pure.

The Secrets are mounted as files, so a rotated Secret reaches the running server without a restart (the
server re-reads its token file when it changes, and refuses everything while it is empty or missing).

* ``tokenSecret`` ({name, key=token}): ``--auth-token-file``; every call but the health checks needs
  ``Authorization: Bearer <token>``.
* ``tls.certificateSecret`` (a ``kubernetes.io/tls`` Secret): HTTPS and gRPC TLS with Triton's flags.
* ``tls.clientCASecret`` ({name, key=ca.crt}): client certificates required on both (mTLS). The kubelet
  cannot present one, so the probes then ask the plain metrics listener, which answers the health
  checks too; the operator presents ``tls.operatorCertificateSecret`` for its own calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.server_spec import CA_KEY, TOKEN_KEY
from ..api.server_types import Auth, InferenceServerSpec
from ..api.typed import as_body, parse

AUTH_DIR = "/var/run/kubeinfer/auth"
TLS_DIR = "/var/run/kubeinfer/tls"
CLIENT_CA_DIR = "/var/run/kubeinfer/client-ca"

#: an InferenceServer's spec, typed or as the custom object's dict (``server_access`` and the model controller
#: still hold the dict; only its ``auth`` is parsed then)
ServerSpec = InferenceServerSpec | Mapping[str, Any]


def auth_of(spec: ServerSpec) -> Auth | None:
    """``spec.auth``, typed (its keys' defaults applied); None without one."""
    if isinstance(spec, InferenceServerSpec):
        return spec.auth
    raw = spec.get("auth")
    return parse(Auth, raw) if raw else None


def auth_spec(spec: ServerSpec) -> Mapping[str, Any]:
    """``spec.auth`` as the custom object states it ({} without one)."""
    if isinstance(spec, InferenceServerSpec):
        return as_body(spec.auth) if spec.auth else {}
    return spec.get("auth") or {}


def token_secret(spec: ServerSpec) -> tuple[str, str] | None:
    auth = auth_of(spec)
    ref = auth.token_secret if auth else None
    return (ref.name, ref.key) if ref and ref.name else None


def tls_secret(spec: ServerSpec) -> str | None:
    auth = auth_of(spec)
    return auth.tls.certificate_secret if auth and auth.tls else None


def client_ca_secret(spec: ServerSpec) -> tuple[str, str] | None:
    auth = auth_of(spec)
    ref = auth.tls.client_ca_secret if auth and auth.tls else None
    return (ref.name, ref.key) if ref and ref.name else None


def operator_certificate_secret(spec: ServerSpec) -> str | None:
    auth = auth_of(spec)
    return (auth.tls.operator_certificate_secret or None) if auth and auth.tls else None


def server_flags(spec: ServerSpec) -> list[str]:
    flags = []
    if token_secret(spec):
        flags.append(f"--auth-token-file={AUTH_DIR}/{TOKEN_KEY}")
    if tls_secret(spec):
        cert, key = f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key"
        flags += [f"--http-tls-cert={cert}", f"--http-tls-key={key}"]
        flags += ["--grpc-use-ssl=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}"]
        if client_ca_secret(spec):
            ca = f"{CLIENT_CA_DIR}/{CA_KEY}"
            flags += [f"--http-tls-client-ca={ca}", "--grpc-use-ssl-mutual=true", f"--grpc-root-cert={ca}"]
    return flags


def _secret_volume(volume: str, secret: str, items: list[tuple[str, str]]) -> dict[str, Any]:
    # 0440 + the pod's fsGroup: readable by the server's group only
    return {
        "name": volume,
        "secret": {
            "secretName": secret,
            "defaultMode": 0o440,
            "items": [{"key": key, "path": path} for key, path in items],
        },
    }


def volumes_and_mounts(spec: ServerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes, mounts = [], []
    if token := token_secret(spec):
        volumes.append(_secret_volume("auth-token", token[0], [(token[1], TOKEN_KEY)]))
        mounts.append({"name": "auth-token", "mountPath": AUTH_DIR, "readOnly": True})
    if tls := tls_secret(spec):
        volumes.append(_secret_volume("tls", tls, [("tls.crt", "tls.crt"), ("tls.key", "tls.key")]))
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        if ca := client_ca_secret(spec):
            volumes.append(_secret_volume("client-ca", ca[0], [(ca[1], CA_KEY)]))
            mounts.append({"name": "client-ca", "mountPath": CLIENT_CA_DIR, "readOnly": True})
    return volumes, mounts


def probe_port_and_scheme(spec: ServerSpec) -> tuple[str, str]:
    """(port name, scheme) the kubelet probes: the HTTP port (HTTPS with TLS), or the plain metrics port
    when client certificates are required (the kubelet has none)."""
    if tls_secret(spec) and client_ca_secret(spec):
        return "metrics", "HTTP"
    return "http", "HTTPS" if tls_secret(spec) else "HTTP"
