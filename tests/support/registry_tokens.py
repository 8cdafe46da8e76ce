"""The token service of Docker's registry token authentication, for a real ``distribution`` registry to trust.

distribution's ``auth: token`` mode sends every client a ``Bearer realm=...,service=...,scope=...`` challenge and
verifies the JSON Web Tokens the client brings back (signature against a JWKS file, issuer, audience, lifetime,
granted actions). It issues no tokens itself: a token service does (Docker Hub's auth.docker.io, Harbor's core,
cesanta/docker_auth). No open-source one is small enough to build for a test, so this is one, written to the
spec (https://distribution.github.io/distribution/spec/auth/token/): ``GET <realm>?service=..&scope=..`` with
optional HTTP Basic credentials, answered with ``{"token", "access_token", "expires_in", "issued_at"}``.
Everything that decides whether a pull is allowed stays the registry's: it checks the token this service signs.

The service grants the requested actions to the one user whose password it was given, and an empty access
list to anyone else (anonymous or wrong password answer 401, as Docker Hub's does for a wrong password).
It records each request (``requests``: Basic user or None, service, scopes), over HTTPS with the test CA.
"""

from __future__ import annotations

import base64
import http.server
import json
import secrets
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import crypt, jwt

ISSUER = "kubeinfer-test-token-service"
SERVICE = "kubeinfer-test-registry"


@dataclass(frozen=True)
class TokenRequest:
    """One request the service answered: who asked (the Basic user, None when anonymous) and for what."""

    user: str | None
    service: str
    scopes: tuple[str, ...]
    status: int


def _b64url(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class TokenService:
    """An HTTPS token service on 127.0.0.1 with its own signing key; ``jwks_path`` is what the registry trusts."""

    def __init__(self, folder: Path, cert: Path, key: Path, user: str, password: str) -> None:
        self.user, self.password = user, password
        self.requests: list[TokenRequest] = []
        self.issued: list[str] = []
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.key_id = secrets.token_hex(8)
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._signer = crypt.RSASigner.from_string(pem, key_id=self.key_id)
        numbers = private.public_key().public_numbers()
        jwk = {"kty": "RSA", "kid": self.key_id, "use": "sig", "alg": "RS256", "n": _b64url(numbers.n)}
        jwk["e"] = _b64url(numbers.e)
        folder.mkdir(parents=True, exist_ok=True)
        self.jwks_path = folder / "jwks.json"
        self.jwks_path.write_text(json.dumps({"keys": [jwk]}))
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                status, body = service._answer(self.path, self.headers.get("Authorization"))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def realm(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/token"

    def registry_auth(self) -> dict[str, Any]:
        """The registry's ``auth`` section for this service."""
        token = {"realm": self.realm, "service": SERVICE, "issuer": ISSUER, "jwks": str(self.jwks_path)}
        return {"token": token}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, authorization: str | None) -> tuple[int, dict[str, Any]]:
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        service = (query.get("service") or [""])[0]
        scopes = tuple(query.get("scope") or [])
        user: str | None = None
        if authorization and authorization.startswith("Basic "):
            name, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            if name != self.user or not secrets.compare_digest(password, self.password):
                self.requests.append(TokenRequest(name, service, scopes, 401))
                return 401, {"errors": [{"code": "UNAUTHORIZED", "message": "incorrect username or password"}]}
            user = name
        if url.path != "/token" or service != SERVICE:
            self.requests.append(TokenRequest(user, service, scopes, 400))
            return 400, {"errors": [{"code": "DENIED", "message": "unknown service"}]}
        access = []
        for scope in scopes if user else ():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]})
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": user or "",
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 5,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        token = jwt.encode(self._signer, claims).decode()
        self.issued.append(token)
        self.requests.append(TokenRequest(user, service, scopes, 200))
        return 200, {"token": token, "access_token": token, "expires_in": 300, "issued_at": time.strftime("%FT%TZ")}
