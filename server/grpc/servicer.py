"""The GRPCInferenceService handlers: translate messages to InferenceService calls and back.

Errors are not handled here: server.py wraps every unary handler with ``errors.unary``; the stream
handler reports a failed request in its response's ``error_message`` and goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from ..observability import otel
from ..runtime.service import InferenceService
from ..sharedmemory import SharedMemoryRegistry
from ..sharedmemory.registry import DISABLED as SHM_DISABLED
from ..vocabulary.errors import DecoupledModelCall, InvalidArgument, Unsupported
from ..vocabulary.limits import DEFAULT_LIMITS, Limits
from . import converters
from . import grpc_service_pb2 as pb
from .streaming import StreamSession

#: Triton RPCs this server does not offer; they answer UNIMPLEMENTED with this reason
UNIMPLEMENTED: dict[str, str] = {}


class InferenceServicer:
    def __init__(
        self, service: InferenceService, limits: Limits = DEFAULT_LIMITS, shm: SharedMemoryRegistry | None = None
    ) -> None:
        self.service = service
        self.limits = limits
        self.shm = shm

    def _shm(self) -> SharedMemoryRegistry:
        if self.shm is None:
            raise Unsupported(SHM_DISABLED)
        return self.shm

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
        await self.service.ensure_loaded(request.name, request.version)
        return converters.metadata_to_pb(self.service.model_metadata(request.name, request.version))

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        await self.service.ensure_loaded(request.name, request.version)
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self.service.model_config(request.name, request.version))
        return response

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        return converters.statistics_to_pb(self.service.statistics(request.name, request.version))

    # ---- inference ----------------------------------------------------------------------
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        infer_request, classification = converters.request_from_pb(request, self.limits, self.shm)
        if otel.propagation:  # the caller's W3C trace context, for --trace-config mode=opentelemetry
            # grpc.aio's context, or the Rust transport's call (rust_server.py)
            metadata = getattr(context, "invocation_metadata", None) or context.metadata
            otel.from_headers(metadata() or ())
        try:
            response = await self.service.infer(infer_request)
        except DecoupledModelCall:
            raise DecoupledModelCall(DecoupledModelCall.GRPC_MESSAGE) from None
        return converters.response_to_pb(response, classification, self.shm)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Triton's streaming: decoupled models answer as they go; see streaming.py."""
        async for reply in StreamSession(self.service, self.limits, context, self.shm).run(requests, context):
            yield reply

    # ---- repository ---------------------------------------------------------------------
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        return converters.index_to_pb(self.service.repository_index(request.ready))

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        params = {k: converters.param_value(v) for k, v in request.parameters.items()}
        await self.service.load_with_parameters(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        param = request.parameters.get("unload_dependents")
        dependents = bool(converters.param_value(param)) if param is not None else False
        await self.service.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # ---- shared-memory extension ---------------------------------------------------------
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._shm().system_status(request.name):
            response.regions[str(region["name"])].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)  # type: ignore[arg-type]
            )
        return response

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._shm().register_system(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._shm().unregister_system(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self._shm().cuda_status(request.name):
            response.regions[str(region["name"])].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region)  # type: ignore[arg-type]
            )
        return response

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        if request.device_id < 0:
            raise InvalidArgument(f"failed to register shared memory region '{request.name}': invalid args")
        self._shm().register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._shm().unregister_cuda(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- trace and logging extensions ----------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        updates: dict[str, Any] = {}
        for name, value in request.settings.items():
            values = list(value.value)
            # no value clears the setting; trace_level is a list, the others one string
            updates[name] = None if not values else values if name == "trace_level" else values[0]
        if request.settings:
            settings = self.service.update_trace_settings(updates, request.model_name)
        else:  # tritonclient's get_trace_settings: a request without settings reads them
            settings = self.service.trace_settings(request.model_name)
        response = pb.TraceSettingResponse()
        for name, value in settings.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [str(value)])
        return response

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        if request.settings:
            updates = {name: converters.param_value(value) for name, value in request.settings.items()}
            settings = self.service.update_log_settings(updates)
        else:
            settings = self.service.log_settings()
        response = pb.LogSettingsResponse()
        for name, value in settings.items():
            target = response.settings[name]
            if isinstance(value, bool):
                target.bool_param = value
            elif isinstance(value, int):
                target.uint32_param = value
            else:
                target.string_param = str(value)
        return response


def unimplemented(rpc: str) -> Any:
    """A handler for a Triton RPC this server does not offer."""

    async def handler(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        raise Unsupported(f"{rpc} is not supported: this server does not implement {UNIMPLEMENTED[rpc]}")

    return handler
