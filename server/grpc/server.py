"""The grpc.aio server: GRPCInferenceService handlers on the same event loop as HTTP — the fallback.

The gRPC listener is served by the Rust transport (rust_server.py) unless it cannot serve the
configuration (gRPC TLS), its module is not built, or ``--grpc-transport grpcio`` asks for this one
(transport.py decides). It costs several times the Rust transport's CPU per call (README 'Performance
against Triton and MLServer'; benchmarks/grpc_transport/).

Handlers are registered by hand under the protocol's service name ``inference.GRPCInferenceService``
(our proto package is ``kubeinfer.inference``; see grpc_service.proto), with request/response
types read from our service descriptor, so the method table cannot drift from the .proto.

Why grpc.aio rather than grpcio's sync server for this fallback (both measured with ``kubeinfer perf`` on
add_sub): the alternative, grpcio's sync server with its own thread pool and each handler bridged onto the
event loop (``run_coroutine_threadsafe``), used less server CPU per request at concurrency 16 but more at
concurrency 1: two more thread hand-offs per request. Neither comes near Triton's C++ front end: even a
trivial handler costs more CPU per RPC than Triton's whole request, and most of the loop thread's gRPC time
is inside grpcio itself, not in our code (README 'Performance against Triton and MLServer'). So the choice
is grpcio's, not ours to optimize further — hence the Rust transport, which costs about what Triton's front
end costs.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ..runtime.auth import PROBE_RPCS, BearerToken, TlsFiles
from ..runtime.service import InferenceService
from . import grpc_service_pb2 as pb
from .errors import deserializer, unary
from .servicer import UNIMPLEMENTED, InferenceServicer, unimplemented
from .settings import GrpcSettings, Keepalive

log = logging.getLogger(__name__)

SERVICE_NAME = "inference.GRPCInferenceService"


def method_handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_cls: Any = getattr(pb, method.input_type.name)
        response_cls: Any = getattr(pb, method.output_type.name)
        fn = getattr(servicer, method.name)
        if method.client_streaming and method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                fn, request_deserializer=deserializer(request_cls), response_serializer=response_cls.SerializeToString
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                unary(fn),
                request_deserializer=deserializer(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
    for name in UNIMPLEMENTED:
        # raw bytes in, nothing out: the request is never parsed
        handlers[name] = grpc.unary_unary_rpc_method_handler(unary(unimplemented(name)))
    return handlers


def header_bytes(value: str | bytes | None) -> bytes | None:
    """A metadata value as bytes, for a byte comparison: grpc hands them over decoded as UTF-8 (invalid bytes
    replaced), and any text encodes back without raising (not as Latin-1, which fails past U+00FF)."""
    if value is None or isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogatepass")


class BearerInterceptor(grpc.aio.ServerInterceptor):
    """Every RPC but the probes' must carry ``authorization: Bearer <token>`` metadata (UNAUTHENTICATED otherwise)."""

    MESSAGE = "this server requires 'authorization: Bearer <token>' metadata (see --auth-token-file)"

    def __init__(self, token: BearerToken) -> None:
        self.token = token

        async def deny_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, self.MESSAGE)

        async def deny_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, self.MESSAGE)
            yield  # pragma: no cover - an async generator, as the streaming RPC needs

        # a unary call is refused through a stream-unary handler, which never reads the request: the refusal is
        # sent on the headers alone, before the message (up to --grpc-max-message-bytes) is received
        self._deny_unary: grpc.RpcMethodHandler[Any, Any] = grpc.stream_unary_rpc_method_handler(deny_unary)
        self._deny_stream: grpc.RpcMethodHandler[Any, Any] = grpc.stream_stream_rpc_method_handler(deny_stream)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        rpc = details.method.rsplit("/", 1)[-1]
        metadata = dict(details.invocation_metadata or ())
        if rpc in PROBE_RPCS or self.token.accepts(header_bytes(metadata.get("authorization"))):
            return await continuation(details)
        return self._deny_stream if rpc == "ModelStreamInfer" else self._deny_unary


def keepalive_options(keepalive: Keepalive) -> list[tuple[str, int]]:
    """Triton's --grpc-keepalive-* / --grpc-http2-* flags as the grpc-core arguments Triton sets from them."""
    return [
        ("grpc.keepalive_time_ms", keepalive.time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.max_pings_without_data),
        ("grpc.http2.min_ping_interval_without_data_ms", keepalive.min_recv_ping_interval_without_data_ms),
        ("grpc.http2.max_ping_strikes", keepalive.max_ping_strikes),
    ]


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=tls.client_ca.read_bytes() if tls.client_ca else None,
        require_client_auth=tls.client_ca is not None,
    )


async def start_grpc_server(service: InferenceService, settings: GrpcSettings) -> grpc.aio.Server:
    limits, max_connection_age_ms = settings.limits, settings.max_connection_age_ms
    options: list[tuple[str, int]] = [
        # oversized messages and metadata are refused by gRPC itself (RESOURCE_EXHAUSTED) before decoding
        ("grpc.max_send_message_length", limits.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", limits.grpc_max_message_bytes),
        ("grpc.max_metadata_size", limits.max_header_bytes),  # soft limit: grpc refuses some requests above it
        ("grpc.absolute_max_metadata_size", limits.max_header_bytes),  # hard limit: refuses all above it
    ]
    if max_connection_age_ms > 0:
        # grpc's own graceful GOAWAY: the server keeps accepting calls meanwhile (a stopping server's
        # not-yet-dispatched calls end CANCELLED, grpc/grpc#41785); open streams finish, within the grace if any
        options.append(("grpc.max_connection_age_ms", max_connection_age_ms))
        if settings.max_connection_age_grace_ms > 0:
            options.append(("grpc.max_connection_age_grace_ms", settings.max_connection_age_grace_ms))
    options += keepalive_options(settings.keepalive)
    interceptors = [BearerInterceptor(settings.token)] if settings.token is not None else []
    server = grpc.aio.server(options=options, interceptors=interceptors)
    servicer = InferenceServicer(service, limits, settings.shm)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, method_handlers(servicer)),))
    address = settings.address
    try:
        if settings.tls is not None:
            bound = server.add_secure_port(address, server_credentials(settings.tls))
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # newer grpcio raises instead of returning 0
        raise SystemExit(f"gRPC listener on {address} failed to start: {exc}") from None
    if bound == 0:
        raise SystemExit(f"gRPC listener on {address} failed to start")
    await server.start()
    log.info("gRPC listening on %s", address)
    return server
