"""The grpc.aio server: GRPCInferenceService handlers on the same event loop as HTTP.

Handlers are registered by hand under the protocol's service name ``inference.GRPCInferenceService``
(our proto package is ``kubeinfer.inference``; see grpc_service.proto), with request/response
types read from our service descriptor, so the method table cannot drift from the .proto.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ..runtime.service import InferenceService
from ..vocabulary.limits import DEFAULT_LIMITS, Limits
from . import grpc_service_pb2 as pb
from .errors import deserializer, unary
from .servicer import UNIMPLEMENTED, InferenceServicer, unimplemented

log = logging.getLogger(__name__)

SERVICE_NAME = "inference.GRPCInferenceService"


def method_handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler]:
    handlers: dict[str, grpc.RpcMethodHandler] = {}
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


async def start_grpc_server(
    service: InferenceService, host: str, port: int, limits: Limits = DEFAULT_LIMITS
) -> grpc.aio.Server:
    options = [
        # oversized messages and metadata are refused by gRPC itself (RESOURCE_EXHAUSTED) before decoding
        ("grpc.max_send_message_length", limits.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", limits.grpc_max_message_bytes),
        ("grpc.max_metadata_size", limits.max_header_bytes),  # soft limit: grpc refuses some requests above it
        ("grpc.absolute_max_metadata_size", limits.max_header_bytes),  # hard limit: refuses all above it
    ]
    server = grpc.aio.server(options=options)
    servicer = InferenceServicer(service, limits)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, method_handlers(servicer)),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # newer grpcio raises instead of returning 0
        raise SystemExit(f"gRPC listener on {address} failed to start: {exc}") from None
    if bound == 0:
        raise SystemExit(f"gRPC listener on {address} failed to start")
    await server.start()
    log.info("gRPC listening on %s", address)
    return server
