"""Optional authentication: a bearer token both front ends check, and the TLS files their listeners use.

Off by default (in a cluster the Service is reached only from inside it, or through an ingress or a
mesh that does TLS). With ``--auth-token-file`` every HTTP and gRPC request except the liveness and
readiness probes must carry ``Authorization: Bearer <token>``; the file is read again when it changes,
so a rotated Kubernetes Secret takes effect without a restart. Emptying or deleting the file revokes the
token: every protected request is refused until the file holds a token again (fail closed; one WARNING says
why). The metrics listener stays separate and unauthenticated (Prometheus scrapes it on its own port).
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
    """The expected token, from a file; ``accepts`` compares bytes in constant time and never raises.

    The file is stat'ed on each check and read again when its identity, size or times change (a Kubernetes
    Secret is swapped by a symlink, so the inode changes). A missing, unreadable or empty file leaves no
    token at all: nothing is accepted (revocation), and one WARNING is logged each time that state begins.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        #: None: revoked (no usable token in the file)
        self._token: bytes | None = None
        self._why = ""  # the reason logged for the current revocation ("" while a token is held)
        self._load()

    def _load(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if stamp == self._stamp:
                return
            token = self.path.read_bytes().strip()
        except OSError as exc:
            self._revoke(f"cannot read it ({exc.strerror or exc})")
            return
        if not token:
            self._revoke("it is empty")
            self._stamp = stamp  # read again once it changes
            return
        if self._token is None and self._why:
            log.warning("the token file %s holds a token again: authenticated requests are served", self.path)
        self._token, self._stamp, self._why = token, stamp, ""

    def _revoke(self, why: str) -> None:
        self._token, self._stamp = None, None
        if why != self._why:
            log.warning(
                "the token file %s no longer holds a token (%s): every request but the health probes is refused "
                "until it does (--auth-token-file)",
                self.path,
                why,
            )
            self._why = why

    def accepts(self, authorization: str | bytes | None) -> bool:
        """Whether ``authorization`` (a header value: bytes from HTTP, str from gRPC metadata) is
        ``Bearer <the token>``; any value, whatever its characters, is only ever True or False."""
        self._load()
        expected = self._token
        if expected is None or not authorization:
            return False
        # str values are compared as the UTF-8 bytes they came from (the Rust transport decodes them as
        # UTF-8); surrogatepass: a str no encoding can give cannot raise, it can only fail to match
        value = authorization if isinstance(authorization, bytes) else authorization.encode("utf-8", "surrogatepass")
        scheme, _, token = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), expected)


@dataclass(frozen=True)
class TlsFiles:
    """A listener's certificate and key; with ``client_ca`` clients must present a certificate it signed (mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None
