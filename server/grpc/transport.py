"""Which transport serves the gRPC listener: the Rust one (rust_server.py) or grpc.aio (server.py).

``--grpc-transport`` (default from ``KUBEINFER_GRPC_TRANSPORT``, else ``auto``):

* ``rust``: the Rust transport, or the server refuses to start saying why (module not built, or a setting
  it does not serve yet);
* ``grpcio``: grpc.aio;
* ``auto``: the Rust transport when its module imports and it serves the configuration, else grpc.aio with
  one INFO line saying why.

Both serve the same ``InferenceServicer`` with the same statuses and messages; the Rust transport costs a
fraction of grpc.aio's CPU per call (README 'Performance against Triton and MLServer';
benchmarks/grpc_transport/README.md).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Protocol

from ..runtime.service import InferenceService
from .settings import GrpcSettings

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "rust", "grpcio")
ENV = "KUBEINFER_GRPC_TRANSPORT"
DEFAULT = "auto"


class GrpcListener(Protocol):
    async def stop(self, grace: float | None) -> Any: ...


def default_transport() -> str:
    """``KUBEINFER_GRPC_TRANSPORT`` if set (checked), else the built-in default."""
    value = os.environ.get(ENV, "").strip() or DEFAULT
    if value not in TRANSPORTS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(TRANSPORTS)}")
    return value


def rust_missing() -> str | None:
    """Why the Rust transport's module cannot be imported (None: it can)."""
    try:
        importlib.import_module(f"{__package__}.kubeinfer_grpc_transport")
    except ImportError as exc:
        return (
            "this installation has no Rust gRPC transport (the package was built without cargo, or not on Linux; "
            f"install Rust from https://rustup.rs and reinstall kubeinfer): {exc}"
        )
    return None


def choose(requested: str, settings: GrpcSettings) -> str:
    """``rust`` or ``grpcio`` for ``requested`` (one of TRANSPORTS) and this configuration."""
    if requested == "grpcio":
        log.debug("gRPC served by grpc.aio (--grpc-transport grpcio)")
        return "grpcio"
    reason = rust_missing()
    if reason is None:
        from .rust_server import unsupported

        reason = unsupported(settings)
    if reason is None:
        log.debug("gRPC served by the Rust transport (--grpc-transport %s)", requested)
        return "rust"
    if requested == "rust":
        raise SystemExit(f"--grpc-transport rust: the Rust gRPC transport cannot serve this server: {reason}")
    log.info("gRPC served by grpc.aio, not the Rust transport: %s", reason)
    return "grpcio"


async def start_grpc_listener(requested: str, service: InferenceService, settings: GrpcSettings) -> GrpcListener:
    """The gRPC listener on the transport ``choose`` picks, started."""
    if choose(requested, settings) == "rust":
        from .rust_server import start_rust_grpc_server

        return await start_rust_grpc_server(service, settings)
    from .server import start_grpc_server

    return await start_grpc_server(service, settings)
