"""``pb_utils.InferenceRequest`` (incoming requests and BLS calls) and the response sender behind it.

Incoming requests: ``get_response_sender()`` returns the request's ``InferenceResponseSender``; its
rules and error texts are Triton's python_backend src/response_sender.cc (checked against Triton 2.51):
``send(response=None, flags=0)`` with ``flags`` 0 or ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; a
non-decoupled model sends exactly one response (then, or with it, the final flag); nothing is sent after
the final flag. ``SenderState`` holds these rules; where accepted responses go is its subclass's business
(the request's stream in the server's process, the stub's channel in a stub process). A non-decoupled
model's one response is held until the final flag and then answers the request; if ``execute`` fails
before the flag, the response sent stands (Triton sent it at once: its client sees it, not the error).

BLS: ``exec()`` / ``async_exec()`` hand the request to the host, which runs it through the target
model's scheduler on the server (batched with other traffic); ``exec(decoupled=True)`` returns an
iterator over the target's responses, the last one empty when the target ends with a flag-only final,
as Triton's does. A request refused before it is queued answers with one error response (the host's
text is Triton's ``Model <name> - Error when running inference: ...``). A BLS request made with
``trace=request.trace()`` is traced as a child of ``request`` (``--trace-config mode=opentelemetry``), as
Triton's "Tracing for BLS models" documents; without it a BLS request is not traced.

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import abc
import json
import logging
import threading
from collections.abc import Awaitable, Iterator
from typing import Any

from . import context
from .pb_types import InferenceResponse, Tensor, TritonModelException

log = logging.getLogger(__name__)

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
RELEASE_ALL = 1  # TRITONSERVER_REQUEST_RELEASE_ALL
RELEASE_RESCHEDULE = 2  # TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
#: what ``ModelRunner.execute`` reports for a request the model released with RELEASE_RESCHEDULE (a string:
#: it crosses the stub's channel as JSON); the backend hands the scheduler ``backends.base.Rescheduled`` for it
RESCHEDULED = "reschedule"


class SenderState(abc.ABC):
    """How one incoming request is answered: the response sender's rules (response_sender.cc).

    Senders may be used from any thread. Subclasses deliver what the rules accept: ``_deliver`` (a
    decoupled response or flag-only final, under the lock so responses keep the order they were
    accepted in), ``_finish`` (a non-decoupled request's one response, sent through the sender),
    ``_answer`` (one ``execute`` returned), ``_fail`` and ``_pending``.
    """

    def __init__(self, decoupled: bool) -> None:
        self.decoupled = decoupled
        self.lock = threading.Lock()
        self.closed = False
        self.sent = 0
        self.held: InferenceResponse | None = None
        self.sender_used = False

    # ---- the model's side --------------------------------------------------------------------------
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
                    self._finish(held)
                return
            self._deliver(response, final)

    @abc.abstractmethod
    def is_cancelled(self) -> bool:
        """Implemented by the in-process and stub subclasses."""

    # ---- the backend's side ------------------------------------------------------------------------
    def answer(self, response: InferenceResponse) -> Any:
        """``execute`` returned ``response`` for this request (non-decoupled): what the backend reports."""
        with self.lock:
            if self.closed:  # it answered through the sender already: that answer stands (as Triton)
                log.error(
                    "execute returned a response for a request already answered through its response sender "
                    "(Unable to send response. Non-decoupled model cannot send more than one response.)"
                )
                return self._pending()
            self.closed = True
            self.sent += 1
        return self._answer(response)

    def fail(self, message: str) -> None:
        """``execute`` failed: a request not yet complete gets ``message`` as its error (and is complete).

        A non-decoupled request that already sent its one response (without the final flag) is answered
        with that response: Triton sends it to the client when it is sent, and drops the error after it."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            held, self.held = self.held, None
        if held is not None:
            self._finish(held)
            return
        self._fail(message)

    def result(self) -> Any:
        """What the backend reports for a request ``execute`` left to its sender (or failed)."""
        return self._pending()

    # ---- delivery: the subclass's ----------------------------------------------------------------
    @abc.abstractmethod
    def _deliver(self, response: InferenceResponse | None, final: bool) -> None:
        """Implemented by the in-process and stub subclasses."""

    @abc.abstractmethod
    def _finish(self, response: InferenceResponse) -> None:
        """Implemented by the in-process and stub subclasses."""

    @abc.abstractmethod
    def _answer(self, response: InferenceResponse) -> Any:
        """Implemented by the in-process and stub subclasses."""

    @abc.abstractmethod
    def _fail(self, message: str) -> None:
        """Implemented by the in-process and stub subclasses."""

    @abc.abstractmethod
    def _pending(self) -> Any:
        """Implemented by the in-process and stub subclasses."""


class InferenceResponseSender:
    """``request.get_response_sender()``: sends this request's responses, from any thread."""

    def __init__(self, state: SenderState) -> None:
        self._state = state

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        self._state.send(response, flags)

    def is_cancelled(self) -> bool:
        return self._state.is_cancelled()


# Triton's class name is InferenceResponseSender; older models refer to ResponseSender
ResponseSender = InferenceResponseSender


class InferenceTrace:
    """``pb_utils.InferenceTrace``: what ``request.trace()`` returns, handed to a BLS request (``trace=``) so that
    the server traces it as a child of ``request``. It names the request's open model span by its Triton trace id
    (0: the request is not traced, and neither is the BLS request)."""

    __slots__ = ("_id",)

    def __init__(self, trace_id: int = 0) -> None:
        self._id = trace_id


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
        trace: InferenceTrace | None = None,
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
        self._trace = trace
        self._state: SenderState | None = None
        self._sender: InferenceResponseSender | None = None
        self._release_flags = RELEASE_ALL

    @classmethod
    def _incoming(cls, fields: dict[str, Any], inputs: list[Tensor], state: SenderState) -> InferenceRequest:
        """An incoming request from the fields the server filled (``bridge.incoming_fields``)."""
        request = cls(
            request_id=fields["id"],
            correlation_id=fields["correlation_id"],
            inputs=inputs,
            requested_output_names=fields["requested"],
            model_name=fields["model_name"],
            model_version=fields["model_version"],
            flags=fields["flags"],
            timeout=fields["timeout"],
            parameters=fields["parameters"],
            trace=InferenceTrace(fields["trace"]),
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
        """How the request is released when ``execute`` returns (python_backend ``InferRequest::SetReleaseFlags``):
        ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` has the scheduler execute this same request again (an
        iterative sequence: ``sequence_batching { iterative_sequence: true }``), the model keeping its state;
        ``TRITONSERVER_REQUEST_RELEASE_ALL`` (the default) releases it. Set it before ``execute`` returns."""
        self._release_flags = int(flags)

    def _rescheduled(self) -> bool:
        """An incoming request the model released with RELEASE_RESCHEDULE."""
        return self._state is not None and bool(self._release_flags & RELEASE_RESCHEDULE)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters, separators=(",", ":"))

    def trace(self) -> InferenceTrace:
        """This request's trace, for a BLS request's ``trace=`` (Triton's ``InferRequest::GetTrace``)."""
        return self._trace if self._trace is not None else InferenceTrace()

    def is_cancelled(self) -> bool:
        return self._state.is_cancelled() if self._state is not None else False

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
        call = _host().bls(self, decoupled)
        if decoupled:
            return _ResponseIterator(call)
        return _last(call)

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """Awaitable form of ``exec`` for ``async def execute``."""
        return self._async_exec(decoupled)

    async def _async_exec(self, decoupled: bool) -> Any:
        call = _host().bls(self, decoupled)
        if decoupled:
            first = await call.anext()  # the request is running (or refused) once this returns
            return _ResponseIterator(call, first)
        last = None
        while (response := await call.anext()) is not None:
            last = response
        assert last is not None
        return last

    # ---- what the host reads of a BLS request ------------------------------------------------
    def _bls_fields(self) -> dict[str, Any]:
        return {
            "model_name": self._model_name,
            "model_version": "" if self._model_version in (-1, None) else str(self._model_version),
            "requested": list(self._requested) or None,
            "id": self._request_id,
            "correlation_id": self._correlation_id,
            "flags": self._flags,
            "timeout": int(self._timeout or 0),
            "parameters": dict(self._parameters),
            # the Triton trace id of the request whose trace was handed over (0: none; not traced)
            "trace": self._trace._id if self._trace is not None else 0,
        }


def _host() -> context.Host:
    host = context.host()
    if host is None:
        raise TritonModelException("BLS is only available inside a model served by kubeinfer")
    return host


def _last(call: context.BlsCall) -> InferenceResponse:
    """The answer of a non-decoupled target: the call's one response."""
    last = None
    while (response := call.next()) is not None:
        last = response
    assert last is not None
    return last


class _ResponseIterator:
    """``exec(decoupled=True)``: the target's responses as they arrive (blocking iteration)."""

    _NONE: Any = object()

    def __init__(self, call: context.BlsCall, first: Any = _NONE) -> None:
        self._call: context.BlsCall | None = call
        self._first = first

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._first is not self._NONE:
            response, self._first = self._first, self._NONE
        elif self._call is None:
            raise StopIteration
        else:
            response = self._call.next()
        if response is None:
            self._call = None
            raise StopIteration
        return response  # type: ignore[no-any-return]
