"""The GRPCInferenceService handlers: translate messages to InferenceService calls and back.

Errors are not handled here: server.py wraps every unary handler with ``errors.unary``; the stream
handler reports a failed request in its response's ``error_message`` and goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from ..runtime.service import InferenceService, load_parameters, parse_config_override
from ..vocabulary.errors import DecoupledModelCall, Unsupported
from ..vocabulary.limits import DEFAULT_LIMITS, Limits
from . import converters
from . import grpc_service_pb2 as pb
from .streaming import StreamSession

#: Triton RPCs this server does not offer; they answer UNIMPLEMENTED with this reason
UNIMPLEMENTED = {
    "SystemSharedMemoryStatus": "the system shared memory extension",
    "SystemSharedMemoryRegister": "the system shared memory extension",
    "SystemSharedMemoryUnregister": "the system shared memory extension",
    "CudaSharedMemoryStatus": "the CUDA shared memory extension",
    "CudaSharedMemoryRegister": "the CUDA shared memory extension",
    "CudaSharedMemoryUnregister": "the CUDA shared memory extension",
    "TraceSetting": "the trace extension",
    "LogSettings": "the logging extension",
}


class InferenceServicer:
    def __init__(self, service: InferenceService, limits: Limits = DEFAULT_LIMITS) -> None:
        self.service = service
        self.limits = limits

    # ---- health and metadata ------------------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        meta = self.service.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return converters.metadata_to_pb(self.service.model_metadata(request.name, request.version))

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self.service.model_config(request.name, request.version))
        return response

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        return converters.statistics_to_pb(self.service.statistics(request.name, request.version))

    # ---- inference ----------------------------------------------------------------------
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        infer_request, classification = converters.request_from_pb(request, self.limits)
        try:
            response = await self.service.infer(infer_request)
        except DecoupledModelCall:
            raise DecoupledModelCall(DecoupledModelCall.GRPC_MESSAGE) from None
        return converters.response_to_pb(response, classification)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Triton's streaming: decoupled models answer as they go; see streaming.py."""
        async for reply in StreamSession(self.service, self.limits, context).run(requests, context):
            yield reply

    # ---- repository ---------------------------------------------------------------------
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        return converters.index_to_pb(self.service.repository_index(request.ready))

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        load_parameters(dict(request.parameters))
        override = None
        if "config" in request.parameters:
            override = parse_config_override(converters.param_value(request.parameters["config"]))
        await self.service.load_model(request.model_name, override)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        param = request.parameters.get("unload_dependents")
        dependents = bool(converters.param_value(param)) if param is not None else False
        await self.service.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()


def unimplemented(rpc: str) -> Any:
    """A handler for a Triton RPC this server does not offer."""

    async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise Unsupported(f"{rpc} is not supported: this server does not implement {UNIMPLEMENTED[rpc]}")

    return handler
