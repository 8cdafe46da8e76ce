"""``ModelStreamInfer``: Triton's gRPC streaming over the runtime's ``ResponseStream``.

Semantics (server/src/grpc/stream_infer_handler.cc, checked against Triton 2.51 with tritonclient):

* requests of one stream run concurrently (so they batch); a decoupled model's responses are written as
  they are sent, in any order across requests; a non-decoupled model's single response is written in
  the order its request arrived;
* every response carries the ``triton_final_response`` parameter (true on a request's last one); a
  decoupled model's flag-only final is written only if the request asked for it with
  ``triton_enable_empty_final_response`` (an empty response with id, model name and the requested
  version);
* an error is a response with ``error_message`` (the stream goes on), unless the stream was opened
  with the ``triton_grpc_error: true`` header: then the first error a model answers with closes the
  stream with that error's gRPC status, as Triton does;
* the client cancelling the RPC cancels every request of the stream (``is_cancelled()`` in the model;
  a request still queued never executes);
* each request of the stream is sampled for tracing as a unary one, its trace ending once its final response was
  handed on or the stream was cancelled; with ``--trace-config mode=opentelemetry`` its spans go under the
  ``traceparent`` metadata the stream was opened with (``observability.trace``, ``observability.otel``).

At most ``--grpc-max-stream-inflight`` requests of one stream run at once: beyond that the stream is
not read until one finishes and its responses are handed to the transport (``run`` takes the next only
when the transport took the last: grpc.aio once it wrote it, the Rust transport while few wait for the
client), so gRPC flow control holds back a client that sends faster than the models answer or than it
reads the answers. (A decoupled model's responses to one request are not held back: they wait here.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ..observability import otel
from ..observability.trace import StreamTrace
from ..runtime.service import InferenceService
from ..sharedmemory import SharedMemoryRegistry
from ..vocabulary.errors import InvalidArgument, ServerError
from ..vocabulary.limits import Limits
from ..vocabulary.streaming import ResponseStream, StreamItem
from ..vocabulary.types import InferenceRequest
from . import converters
from . import grpc_service_pb2 as pb
from .errors import check_parsed, status_of

FINAL_PARAMETER = "triton_final_response"
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
GRPC_ERROR_HEADER = "triton_grpc_error"


class _Abort:
    """Close the stream with this status (``triton_grpc_error`` mode)."""

    def __init__(self, error: ServerError) -> None:
        self.code = getattr(grpc.StatusCode, error.grpc_code, grpc.StatusCode.UNKNOWN)
        self.message = error.message


_END = object()
#: in ``out`` after a request's last response: its place is freed once everything before it was taken
_RELEASE = object()
Outgoing = pb.ModelStreamInferResponse | _Abort


class _Slot:
    """A non-decoupled request's place in the write order."""

    __slots__ = ("message",)

    def __init__(self) -> None:
        self.message: Outgoing | None = None


class StreamSession:
    def __init__(
        self, service: InferenceService, limits: Limits, context: Any, shm: SharedMemoryRegistry | None = None
    ) -> None:
        self.service = service
        self.limits = limits
        #: client shared-memory regions (tensors of stream requests may live there too, as with Triton)
        self.shm = shm
        self.grpc_error = _header(context, GRPC_ERROR_HEADER) == "true"
        self.out: asyncio.Queue[Any] = asyncio.Queue()
        self.ordered: deque[_Slot] = deque()
        self.slots = asyncio.Semaphore(limits.grpc_max_stream_inflight)
        self.inflight = 0
        self.reading = True
        self.tasks: set[asyncio.Task[None]] = set()
        self.streams: set[ResponseStream] = set()

    async def run(self, requests: AsyncIterator[pb.ModelInferRequest], context: Any) -> AsyncIterator[Any]:
        if otel.propagation:  # the caller's W3C trace context, for every request of the stream (the reader's copy)
            # grpc.aio's context, or the Rust transport's call (rust_server.py)
            metadata = getattr(context, "invocation_metadata", None) or context.metadata
            otel.from_headers(metadata() or ())
        reader = asyncio.create_task(self._read(requests))
        try:
            while (item := await self.out.get()) is not _END:
                if item is _RELEASE:
                    self.slots.release()
                    continue
                if isinstance(item, _Abort):
                    await context.abort(item.code, item.message)
                yield item
        finally:
            for task in (reader, *self.tasks):
                task.cancel()
            for stream in list(self.streams):  # the client went away (or the stream was closed on error)
                stream.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        try:
            async for message in requests:
                await self.slots.acquire()
                self.inflight += 1
                self._issue(message)
        finally:
            self.reading = False
            self._maybe_end()

    def _issue(self, message: pb.ModelInferRequest) -> None:
        try:
            check_parsed(message)  # a message that does not parse: an error response, the stream goes on
            request, classification, empty_final = _request(message, self.limits, self.shm)
            stream, trace = self.service.tracer.stream(request, self.service.infer_stream)
        except Exception as exc:  # refused before it ran: an error response, the stream goes on
            _, text = status_of(exc)
            reply = pb.ModelStreamInferResponse(error_message=text)
            reply.infer_response.id = getattr(message, "id", "")
            refused = _Slot()
            refused.message = reply
            self.ordered.append(refused)
            self._finished()
            return
        self.streams.add(stream)
        slot = None if request.stream is not None else _Slot()  # decoupled requests are not ordered
        if slot is not None:
            self.ordered.append(slot)
        task = asyncio.create_task(self._pump(stream, request, classification, empty_final, slot, trace))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _pump(
        self,
        stream: ResponseStream,
        request: InferenceRequest,
        classification: dict[str, converters.OutputOptions],
        empty_final: bool,
        slot: _Slot | None,
        trace: StreamTrace | None,
    ) -> None:
        last = None
        try:
            async for item in stream:
                last = item.response or last
                reply: Outgoing | None
                if item.error is not None and self.grpc_error:
                    reply = _Abort(item.error)
                else:
                    reply = _reply(item, request, classification, empty_final, self.shm)
                if reply is None:
                    continue
                if slot is not None:
                    slot.message = reply
                else:
                    self.out.put_nowait(reply)
                if isinstance(reply, _Abort):
                    break
        finally:
            if trace is not None:
                trace.end(last)
            self.streams.discard(stream)
            self._finished()

    def _finished(self) -> None:
        """One request is complete: write what is due in order, free its place once that is taken, end when
        all are done."""
        while self.ordered and self.ordered[0].message is not None:
            self.out.put_nowait(self.ordered.popleft().message)
        self.inflight -= 1
        self.out.put_nowait(_RELEASE)
        self._maybe_end()

    def _maybe_end(self) -> None:
        if not self.reading and self.inflight == 0:
            while self.ordered and self.ordered[0].message is not None:
                self.out.put_nowait(self.ordered.popleft().message)
            self.out.put_nowait(_END)


def _request(
    message: pb.ModelInferRequest, limits: Limits, shm: SharedMemoryRegistry | None = None
) -> tuple[InferenceRequest, dict[str, converters.OutputOptions], bool]:
    request, classification = converters.request_from_pb(message, limits, shm)
    empty_final = False
    if EMPTY_FINAL_PARAMETER in message.parameters:
        param = message.parameters[EMPTY_FINAL_PARAMETER]
        if param.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidArgument(f"invalid value type for '{EMPTY_FINAL_PARAMETER}' parameter, expected bool_param.")
        empty_final = param.bool_param
    # "triton_" parameters are Triton's own (docs/protocol/extension_parameters.md): never the model's
    for key in [k for k in request.parameters if k.startswith("triton_")]:
        del request.parameters[key]
    return request, classification, empty_final


def _reply(
    item: StreamItem,
    request: InferenceRequest,
    classification: dict[str, converters.OutputOptions],
    empty_final: bool,
    shm: SharedMemoryRegistry | None = None,
) -> pb.ModelStreamInferResponse | None:
    if item.response is not None:
        response = converters.response_to_pb(item.response, classification, shm)
        response.parameters[FINAL_PARAMETER].bool_param = item.final
        return pb.ModelStreamInferResponse(infer_response=response)
    if item.error is None and not empty_final:
        return None  # a flag-only final nobody asked to see
    reply = pb.ModelStreamInferResponse(error_message=item.error.message if item.error is not None else "")
    infer_response = reply.infer_response
    infer_response.id = request.id
    infer_response.model_name = request.model_name
    infer_response.model_version = request.model_version
    infer_response.parameters[FINAL_PARAMETER].bool_param = item.final
    return reply


def _header(context: Any, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return None
