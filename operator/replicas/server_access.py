"""How the operator calls a server pool whose ``spec.auth`` turns on a token or TLS.

The operator reads every replica's repository index; with ``auth.tokenSecret`` it sends the token, with
``auth.tls`` it speaks HTTPS (verifying the chain against the certificate Secret's ``ca.crt`` when it has
one; replicas are reached by pod address, so the host name is not checked), and with client certificates
required it presents ``auth.tls.operatorCertificateSecret``. Secrets are read at most once per ``ttl``
seconds per pool, so a rotated token is picked up within that time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api.typed import as_body
from . import server_auth
from .server_auth import ServerSpec

ReadSecret = Callable[[str, str], dict[str, Any] | None]


class AccessError(Exception):
    """The operator cannot call the pool the way its spec asks (a Secret is missing or not readable)."""


@dataclass(frozen=True)
class ServerAccess:
    scheme: str = "http"
    headers: Mapping[str, str] = field(default_factory=dict)
    #: the TLS settings' identity (empty: plain HTTP); one HTTP client per distinct value
    tls_key: str = ""
    ca_pem: bytes | None = None
    client_pem: tuple[bytes, bytes] | None = None

    def url(self, plain_url: str) -> str:
        return "https://" + plain_url.removeprefix("http://") if self.scheme == "https" else plain_url

    def ssl_context(self, workdir: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode()) if self.ca_pem else ssl.create_default_context()
        ctx.check_hostname = False  # replicas are reached by pod address
        if not self.ca_pem:
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_pem:
            # load_cert_chain reads files: a private folder of the operator's, removed as soon as it is loaded
            with tempfile.TemporaryDirectory(dir=workdir) as folder:
                cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
                for path, data in ((cert, self.client_pem[0]), (key, self.client_pem[1])):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                ctx.load_cert_chain(cert, key)
        return ctx


PLAIN = ServerAccess()


def _data(secret: Mapping[str, Any], key: str) -> bytes | None:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if value else None


class AccessBook:
    """ServerAccess per pool, from its spec and Secrets (``read``: namespace, name → Secret or None)."""

    def __init__(self, read: ReadSecret, ttl: float = 30.0) -> None:
        self.read = read
        self.ttl = ttl
        self._cache: dict[tuple[str, str, str], tuple[float, ServerAccess | str]] = {}
        self._loading: dict[tuple[str, str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _secret(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            secret = self.read(namespace, name)
        except ApiException as exc:
            if exc.status == 403:
                raise AccessError(
                    f"the operator may not read Secret '{namespace}/{name}' (spec.auth): bind the chart's "
                    f"secret-reader ClusterRole in '{namespace}' (Helm value rbac.secretNamespaces)"
                ) from None
            raise
        if secret is None:
            raise AccessError(f"Secret '{namespace}/{name}' named in spec.auth does not exist")
        return secret

    def _build(self, namespace: str, spec: ServerSpec) -> ServerAccess:
        headers = {}
        if ref := server_auth.token_secret(spec):
            token = _data(self._secret(namespace, ref[0]), ref[1])
            if not token or not token.strip():
                raise AccessError(f"Secret '{namespace}/{ref[0]}' has no token under key '{ref[1]}'")
            headers["Authorization"] = f"Bearer {token.decode('utf-8', 'replace').strip()}"
        tls = server_auth.tls_secret(spec)
        if not tls:
            return ServerAccess(headers=headers)
        ca = _data(self._secret(namespace, tls), "ca.crt")
        client = None
        if name := server_auth.operator_certificate_secret(spec):
            secret = self._secret(namespace, name)
            cert, key = _data(secret, "tls.crt"), _data(secret, "tls.key")
            if not cert or not key:
                raise AccessError(f"Secret '{namespace}/{name}' needs tls.crt and tls.key")
            client = (cert, key)
        digest = hashlib.sha256(repr((ca, client)).encode()).hexdigest()
        return ServerAccess("https", headers, digest, ca, client)

    def for_server(self, namespace: str, server: str, spec: ServerSpec) -> ServerAccess | str:
        """How to call the pool, or why the operator cannot (a message for the status). ``spec`` typed (the model
        controller's) or as the object states it: both are one cache entry, keyed by the typed ``auth``."""
        auth = server_auth.auth_of(spec)
        stated = as_body(auth) if auth is not None else {}
        if not stated:
            return PLAIN
        key = (namespace, server, json.dumps(stated, sort_keys=True))
        with self._guard:
            hit = self._cache.get(key)
            loading = self._loading.setdefault(key, threading.Lock())
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        with loading:  # one read of the Secrets when the entry expires, however many models ask at once
            with self._guard:
                hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            try:
                access: ServerAccess | str = self._build(namespace, spec)
            except AccessError as exc:
                access = str(exc)
            with self._guard:
                self._cache[key] = (time.monotonic(), access)
        return access
