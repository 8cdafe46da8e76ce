"""What the gRPC listener is started with, on either transport (transport.py chooses which)."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.auth import BearerToken, TlsFiles
from ..sharedmemory import SharedMemoryRegistry
from ..vocabulary.limits import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class Keepalive:
    """HTTP/2 keepalive and ping policy: Triton's --grpc-keepalive-* and --grpc-http2-* flags, its defaults.

    Both transports send a PING on a connection quiet for ``time_ms`` and close it when the answer takes longer
    than ``timeout_ms``. grpc.aio applies the rest as grpc-core does; the Rust transport (hyper) pings idle
    connections too (as with ``permit_without_calls``) and answers every client PING (no ping strikes).
    """

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval_without_data_ms: int = 300_000
    max_ping_strikes: int = 2


@dataclass(frozen=True)
class GrpcSettings:
    host: str
    port: int
    limits: Limits = DEFAULT_LIMITS
    #: --auth-token-file: every RPC but the probes needs it
    token: BearerToken | None = None
    #: --grpc-use-ssl (with --grpc-use-ssl-mutual: client certificates signed by tls.client_ca required)
    tls: TlsFiles | None = None
    #: client shared-memory regions the handlers read and write tensors in
    shm: SharedMemoryRegistry | None = None
    #: each connection gets a graceful GOAWAY after this long (0: never), as grpc's max_connection_age
    max_connection_age_ms: int = 0
    #: then closed this long after its GOAWAY if calls still run (0: they finish)
    max_connection_age_grace_ms: int = 0
    keepalive: Keepalive = Keepalive()

    @property
    def address(self) -> str:
        """``host:port`` as grpc writes it (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
