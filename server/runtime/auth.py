"""Optional authentication: a bearer token both front ends check, and the TLS files their listeners use.

Off by default (in a cluster the Service is reached only from inside it, or through an ingress or a
mesh that does TLS). With ``--auth-token-file`` every HTTP and gRPC request except the liveness and
readiness probes must carry ``Authorization: Bearer <token>``; the file is read again when it changes,
so a rotated Kubernetes Secret takes effect without a restart. The metrics listener stays separate and
unauthenticated (Prometheus scrapes it on its own port).
"""

from __future__ import annotations

import hmac
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: requests that never need the token: what kubelet's probes call
PROBE_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
PROBE_RPCS = frozenset({"ServerLive", "ServerReady"})


class BearerToken:
    """The expected token, from a file; ``accepts`` compares in constant time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = b""
        self._load()

    def _load(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        token = self.path.read_bytes().strip()
        if not token:
            raise ValueError(f"the token file {self.path} is empty")
        self._token, self._stamp = token, stamp

    def accepts(self, authorization: str | bytes | None) -> bool:
        try:
            self._load()
        except (OSError, ValueError) as exc:  # keep the last good token while a Secret is being replaced
            log.warning("cannot re-read the token file %s: %s", self.path, exc)
        if not authorization:
            return False
        value = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
        scheme, _, token = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._token)


@dataclass(frozen=True)
class TlsFiles:
    """A listener's certificate and key; with ``client_ca`` clients must present a certificate it signed (mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None
