"""What the gRPC listener is started with, on either transport (transport.py chooses which)."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.auth import BearerToken, TlsFiles
from ..sharedmemory import SharedMemoryRegistry
from ..vocabulary.limits import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class GrpcSettings:
    host: str
    port: int
    limits: Limits = DEFAULT_LIMITS
    #: --auth-token-file: every RPC but the probes needs it
    token: BearerToken | None = None
    #: --grpc-use-ssl (grpc.aio only: transport.choose falls back to it)
    tls: TlsFiles | None = None
    #: client shared-memory regions the handlers read and write tensors in
    shm: SharedMemoryRegistry | None = None
    #: each connection gets a graceful GOAWAY after this long (0: never), as grpc's max_connection_age
    max_connection_age_ms: int = 0

    @property
    def address(self) -> str:
        """``host:port`` as grpc writes it (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
