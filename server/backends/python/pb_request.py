"""``pb_utils.InferenceRequest`` (incoming requests and BLS calls) and the response sender behind it.

Incoming requests: ``get_response_sender()`` returns the request's ``InferenceResponseSender``; its
rules and error texts are Triton's python_backend src/response_sender.cc (checked against Triton 2.51):
``send(response=None, flags=0)`` with ``flags`` 0 or ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; a
non-decoupled model sends exactly one response (then, or with it, the final flag); nothing is sent after
the final flag. A decoupled model's responses go to the request's ``ResponseStream`` as they are sent;
a non-decoupled model's one response is held until the final flag and then answers the request.

BLS: ``exec()`` / ``async_exec()`` run a request through the target model's scheduler on the server's
event loop (batched with other traffic); ``exec(decoupled=True)`` returns an iterator over the target's
responses, the last one empty when the target ends with a flag-only final, as Triton's does. Errors
raised before the request is queued read ``Model <name> - Error when running inference: ...`` (pb_stub's
``InferRequest::Exec``); a response error keeps its message and code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from ...vocabulary import errors
from ...vocabulary.sequence import sequence_parameters
from ...vocabulary.streaming import ResponseStream, StreamItem
from ...vocabulary.types import InferenceRequest as CoreRequest
from . import context
from .pb_types import InferenceResponse, Tensor, TritonError, TritonModelException

if TYPE_CHECKING:
    from ..base import RequestResult

log = logging.getLogger(__name__)

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
#: request parameters Triton's front ends consume themselves; a model never sees them
RESERVED_PARAMETERS = frozenset(
    {"priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output"}
)


def outputs_of(
    response: InferenceResponse, wanted: frozenset[str] | None
) -> dict[str, np.ndarray] | errors.ServerError:
    """A pb_utils response as the runtime's outputs (pruned to the requested ones) or typed error."""
    err = response.error()
    if err is not None:
        code = err.code().name
        return errors.error_for_code(code, err.message(), "CANCELED" if code == "CANCELLED" else "BACKEND")
    outputs: dict[str, np.ndarray] = {}
    for t in response.output_tensors():
        name = t.name()
        if wanted is not None and name not in wanted:
            continue
        array = t.as_numpy()
        if array.dtype == np.object_ and array.size:
            array = np.vectorize(_to_bytes, otypes=[object])(array)
        outputs[name] = array
    return outputs


def _to_bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8")


class RequestState:
    """How one incoming request is answered: the sender's bookkeeping and where responses go.

    ``done`` resolves when the request is complete: with its outputs or error (non-decoupled), or with
    None once the final flag went to the stream (decoupled). Senders may be used from any thread.
    """

    __slots__ = ("core", "decoupled", "wanted", "lock", "closed", "sent", "held", "done", "sender_used")

    def __init__(self, core: CoreRequest, decoupled: bool, wanted: frozenset[str] | None) -> None:
        self.core = core
        self.decoupled = decoupled
        self.wanted = wanted
        self.lock = threading.Lock()
        self.closed = False
        self.sent = 0
        self.held: InferenceResponse | None = None
        self.done: Future[RequestResult] = Future()
        self.sender_used = False

    # ---- the response sender's rules (response_sender.cc) ---------------------------------------
    def send(self, response: InferenceResponse | None, flags: int) -> None:
        if flags not in (0, FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"Expected an 'InferenceResponse' object, found type '{type(response)}'.")
        final = flags == FINAL
        with self.lock:
            if not self.decoupled:
                if response is not None and self.sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and final and self.sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending "
                        "a response."
                    )
            if self.closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            self.closed = final
            self.sent += 1
            if not self.decoupled:
                if response is not None:
                    self.held = response
                if final:
                    held, self.held = self.held, None
                    assert held is not None
                    self.done.set_result(outputs_of(held, self.wanted))
                return
            # under the lock: responses sent from several threads reach the stream in the order accepted
            stream = self.core.stream
            assert stream is not None, "decoupled requests carry a stream"
            if response is None:
                stream.send(None, final=True)
            else:
                result = outputs_of(response, self.wanted)
                if isinstance(result, errors.ServerError):
                    stream.send(None, error=result, final=final)
                else:
                    stream.send(result, final=final, parameters=response._parameters or None)
        if final:
            self.done.set_result(None)

    # ---- the backend's side ----------------------------------------------------------------------
    def answer(self, response: InferenceResponse) -> RequestResult:
        """``execute`` returned ``response`` for this request (non-decoupled)."""
        with self.lock:
            if self.closed:  # it answered through the sender already: that answer stands (as Triton)
                log.error(
                    "model '%s': execute returned a response for a request already answered through its response "
                    "sender (Unable to send response. Non-decoupled model cannot send more than one response.)",
                    self.core.model_name,
                )
                return self.done
            self.closed = True
            self.sent += 1
        result = outputs_of(response, self.wanted)
        if self.sender_used:
            self.done.set_result(result)
            return self.done
        return result

    def fail(self, error: errors.ServerError) -> None:
        """``execute`` failed: every request not yet complete gets ``error`` (and is complete)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        if self.decoupled:
            assert self.core.stream is not None
            self.core.stream.fail(error)
            self.done.set_result(None)
        else:
            self.done.set_result(error)

    def result(self) -> RequestResult:
        """What the scheduler gets back for this request when ``execute`` returns."""
        if self.done.done() and not self.sender_used:
            return self.done.result()
        return self.done


class InferenceResponseSender:
    """``request.get_response_sender()``: sends this request's responses, from any thread."""

    def __init__(self, state: RequestState) -> None:
        self._state = state

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        self._state.send(response, flags)

    def is_cancelled(self) -> bool:
        return self._state.core.cancelled


# Triton's class name is InferenceResponseSender; older models refer to ResponseSender
ResponseSender = InferenceResponseSender


class InferenceRequest:
    """An incoming request (in ``execute``) or a BLS request to any loaded model (``exec``)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | bytes = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if isinstance(model_name, bytes):  # Triton accepts the name as bytes too
            model_name = model_name.decode("utf-8")
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names) if requested_output_names is not None else []
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._request_id = request_id
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters = dict(parameters or {})
        self._state: RequestState | None = None
        self._sender: InferenceResponseSender | None = None

    @classmethod
    def _incoming(
        cls, core: CoreRequest, state: RequestState, output_names: list[str], version: int
    ) -> InferenceRequest:
        request = cls(
            request_id=core.id,
            correlation_id=core.parameters.get("sequence_id", 0) or 0,
            inputs=[Tensor(n, a) for n, a in core.inputs.items()],
            requested_output_names=core.requested_outputs if core.requested_outputs is not None else output_names,
            model_name=core.model_name,
            model_version=version,
            flags=_sequence_flags(core.parameters),
            timeout=core.timeout_us,
            parameters={
                k: v
                for k, v in core.parameters.items()
                if k not in RESERVED_PARAMETERS
                and not k.startswith("triton_")
                and isinstance(v, (str, int, float, bool))
            },
        )
        request._state = state
        return request

    # ---- accessors Triton offers on incoming requests ---------------------------------------
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> set[str]:
        return set(self._requested)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def set_release_flags(self, flags: int) -> None:
        """Triton's request rescheduling (sequence batching); kubeinfer releases every request at once."""
        if flags & 2:  # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
            raise TritonModelException("Request rescheduling is not supported by kubeinfer's Python backend.")

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters, separators=(",", ":"))

    def trace(self) -> None:
        return None

    def is_cancelled(self) -> bool:
        return self._state.core.cancelled if self._state is not None else False

    def get_response_sender(self) -> InferenceResponseSender:
        if self._state is None:
            raise TritonModelException("Only requests handed to execute() have a response sender.")
        if self._sender is None:
            self._state.sender_used = True
            self._sender = InferenceResponseSender(self._state)
        return self._sender

    # ---- BLS --------------------------------------------------------------------------------
    def exec(self, decoupled: bool = False) -> Any:
        """Run the request through its model's scheduler; blocks. ``decoupled=True``: an iterator of responses."""
        started = on_loop(self._start(decoupled))
        try:
            stream = started.result()
        except _IssueError as exc:
            return _ResponseIterator(None, exc.response) if decoupled else exc.response
        if decoupled:
            return _ResponseIterator(stream, None)
        return on_loop(_last(stream)).result()

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Awaitable form of ``exec`` for ``async def execute``."""
        return self._async_exec(decoupled)

    async def _async_exec(self, decoupled: bool) -> Any:
        try:
            stream = await asyncio.wrap_future(on_loop(self._start(decoupled)))
        except _IssueError as exc:
            return _ResponseIterator(None, exc.response) if decoupled else exc.response
        if decoupled:
            return _ResponseIterator(stream, None)
        return await asyncio.wrap_future(on_loop(_last(stream)))

    async def _start(self, decoupled: bool) -> ResponseStream:
        """On the server loop: checks as pb_stub/request_executor.cc makes them, then start the request."""
        registry = context.server.registry
        assert registry is not None
        name = self._model_name
        version = "" if self._model_version in (-1, None) else str(self._model_version)
        try:
            if not registry.is_model_ready(name, version):
                raise errors.Unavailable(f"Failed for execute the inference request. Model '{name}' is not ready.")
            if not decoupled and registry.is_decoupled(name, version):
                raise errors.DecoupledModelCall(
                    f"Model {name} is using the decoupled. The current BLS request call doesn't support models "
                    "using the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' "
                    "or 'async_exec' calls for decoupled models.'"
                )
            return registry.infer_stream(self._core_request(version))
        except errors.ServerError as exc:
            message = f"Model {name} - Error when running inference: {exc.message}"
            raise _IssueError(InferenceResponse(error=TritonError(message, TritonError.INTERNAL))) from None

    def _core_request(self, version: str) -> CoreRequest:
        # a BLS step of a sequence: its id and start/end flags travel as the sequence extension's parameters
        params = {**self._parameters, **sequence_parameters(self._correlation_id, self._flags)}
        return CoreRequest(
            model_name=self._model_name,
            model_version=version,
            inputs={t.name(): t.as_numpy() for t in self._inputs},
            requested_outputs=list(self._requested) or None,
            id=self._request_id,
            parameters=params,
            timeout_us=int(self._timeout or 0),
        )


def _sequence_flags(params: dict[str, Any]) -> int:
    return (1 if params.get("sequence_start") else 0) | (2 if params.get("sequence_end") else 0)


class _IssueError(Exception):
    """A BLS request refused before it was queued; Triton answers it with an error response."""

    def __init__(self, response: InferenceResponse) -> None:
        super().__init__(response.error())
        self.response = response


def on_loop(coro: Any) -> Future[Any]:
    """Schedule ``coro`` on the server loop from a model's thread."""
    loop = context.server.loop
    if loop is None:
        coro.close()
        raise TritonModelException("BLS is only available inside a model served by kubeinfer")
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise TritonModelException("BLS exec() must not be called on the server's event loop")
    return asyncio.run_coroutine_threadsafe(coro, loop)


def _response_of(item: StreamItem) -> InferenceResponse:
    if item.error is not None:
        code = getattr(TritonError, errors.code_of(item.error))
        return InferenceResponse(error=TritonError(item.error.message, code))
    if item.response is None:  # a flag-only final: Triton's iterator yields an empty response
        return InferenceResponse()
    response = item.response
    return InferenceResponse([Tensor(n, a) for n, a in response.outputs.items()], parameters=response.parameters)


async def _last(stream: ResponseStream) -> InferenceResponse:
    """The answer of a non-decoupled target: the stream's one item."""
    last = None
    async for item in stream:
        last = item
    assert last is not None
    return _response_of(last)


class _ResponseIterator:
    """``exec(decoupled=True)``: the target's responses as they arrive (blocking iteration)."""

    def __init__(self, stream: ResponseStream | None, error: InferenceResponse | None) -> None:
        self._stream = stream
        self._error = error

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._error is not None:
            error, self._error = self._error, None
            return error
        if self._stream is None:
            raise StopIteration
        try:
            item = on_loop(_next_item(self._stream)).result()
        except StopAsyncIteration:
            self._stream = None
            raise StopIteration from None
        return _response_of(item)


async def _next_item(stream: ResponseStream) -> StreamItem:
    return await stream.__anext__()
