"""Triton's OpenTelemetry trace mode (``--trace-config mode=opentelemetry``): spans exported over OTLP/HTTP.

What Triton does (docs/user_guide/trace.md "OpenTelemetry trace support", src/tracer.cc), and so this module:

* Settings ``--trace-config opentelemetry,<setting>=<value>``: ``url`` (default ``http://localhost:4318/v1/traces``;
  Triton's form ``host:port/v1/traces`` is sent over http), ``resource=<key>=<value>`` (repeatable; default
  ``service.name=triton-inference-server``; ``OTEL_RESOURCE_ATTRIBUTES`` too), and the batch span processor's
  ``bsp_max_queue_size`` (2048), ``bsp_schedule_delay`` (ms, 5000) and ``bsp_max_export_batch_size`` (512), which
  fall back to ``OTEL_BSP_*`` as Triton's do. They are start-time settings: the trace extension neither shows nor
  changes them.
* One trace per sampled request: a top-level span ``InferRequest``; under it a model span named after the model
  (attributes ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``, ``triton.trace_parent_id``;
  events ``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END``), and under that a ``compute`` span (events
  ``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``). Every span is of kind
  SERVER and comes from the tracer ``triton-server``, as Triton's.
* An ensemble's composing models are model spans (with their compute spans) under the ensemble's model span, each
  with a trace id of its own and the ensemble's as ``triton.trace_parent_id``.
* A Python model's BLS request made with ``trace=request.trace()`` (Triton's "Tracing for BLS models": without it
  a BLS request is not traced) is a model span (with its compute span) under the model span of the request that
  made it, in the same way; it ends once the model has read its final response, or when its stream is cancelled.
  Its own BLS requests and ensemble steps go under it in turn.
* A streamed request (gRPC ``ModelStreamInfer``, a decoupled model's responses, HTTP ``generate`` and
  ``generate_stream``) has the same spans; they end when the front end has handed on the request's final
  response, or when the stream is cancelled (``trace.StreamTrace``). Each request of a gRPC stream is a trace of its
  own, under the ``traceparent`` the stream was opened with.
* A W3C ``traceparent`` (``tracestate``) header (HTTP) or metadata entry (gRPC) makes the ``InferRequest`` span a
  child of the caller's span, and such a request is traced whatever ``rate`` and ``count`` say (Triton 24.01+).
* Export happens on the batch processor's thread: a collector that is down or a bad URL costs the requests
  nothing (the exporter logs its failures).

Timestamps are this process's monotonic clock moved onto the wall clock by one offset taken at start, as Triton
adds its ``time_offset_`` to steady-clock stamps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from ..vocabulary.registry_view import EndSpan, Route, StartStream
from ..vocabulary.streaming import ResponseStream
from ..vocabulary.types import ExecutionTimings, InferenceRequest, InferenceResponse

log = logging.getLogger(__name__)

#: Triton's defaults (docs/user_guide/trace.md "OpenTelemetry trace APIs settings")
DEFAULT_URL = "http://localhost:4318/v1/traces"
DEFAULT_RESOURCE = {"service.name": "triton-inference-server"}
BSP_SETTINGS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")
#: Triton's tracer name (kTritonTracer)
TRACER_NAME = "triton-server"
ROOT_SPAN = "InferRequest"
#: how long the server's shutdown waits for the last spans to be exported
SHUTDOWN_WAIT_S = 3.0
COMPUTE_SPAN = "compute"

#: front ends hand the caller's W3C context here (``incoming``) only while an exporter exists: reading the
#: header costs nothing otherwise
propagation = False
#: (traceparent, tracestate) of the request this task serves
_incoming: ContextVar[tuple[str, str | None] | None] = ContextVar("kubeinfer_otel_incoming", default=None)
#: the trace (and the span new model spans go under) of the request this task serves
_active: ContextVar[_Frame | None] = ContextVar("kubeinfer_otel_active", default=None)


def incoming(traceparent: str | bytes | None, tracestate: str | bytes | None = None) -> None:
    """The caller's ``traceparent``/``tracestate`` for the request this task is about to serve."""
    if traceparent:
        parent = traceparent.decode("latin-1") if isinstance(traceparent, bytes) else traceparent
        state = tracestate.decode("latin-1") if isinstance(tracestate, bytes) else tracestate
        _incoming.set((parent, state))


def carried(headers: Iterable[tuple[Any, Any]]) -> tuple[str | bytes, str | bytes | None] | None:
    """(traceparent, tracestate) from HTTP headers (bytes, lower-case) or gRPC metadata (str); None without one."""
    parent = state = None
    for key, value in headers:
        if key == b"traceparent" or key == "traceparent":
            parent = value
        elif key == b"tracestate" or key == "tracestate":
            state = value
    return None if parent is None else (parent, state)


def from_headers(headers: Iterable[tuple[Any, Any]]) -> None:
    """``incoming`` from HTTP headers or gRPC metadata."""
    context = carried(headers)
    if context is not None:
        incoming(*context)
    elif _incoming.get() is not None:  # never a context of an earlier request served by this task
        _incoming.set(None)


def parse_setting(config: dict[str, Any], key: str, value: str) -> None:
    """One ``--trace-config opentelemetry,<key>=<value>`` into ``config``; raises ValueError."""
    if key == "url":
        config["url"] = value
    elif key == "resource":
        name, sep, attr = value.partition("=")
        if not sep or not name:
            raise ValueError(f"opentelemetry resource '{value}': expected <key>=<value>")
        config.setdefault("resource", {})[name] = attr
    elif key in BSP_SETTINGS:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"opentelemetry setting '{key}' must be an integer, got '{value}'") from None
        if number < (0 if key == "bsp_schedule_delay" else 1):
            raise ValueError(f"opentelemetry setting '{key}' must be positive, got {number}")
        config[key] = number
    else:
        raise ValueError(f"unknown opentelemetry setting '{key}'")


def endpoint(url: str) -> str:
    return url if "://" in url else f"http://{url}"


@dataclass
class _Trace:
    trace_id: int
    #: the caller's context (None: the trace starts here)
    remote: Any
    #: the ``InferRequest`` span, started with the first model span (at its request's arrival)
    root: Any = None
    model_spans: int = 0


@dataclass
class _Frame:
    trace: _Trace
    #: the span new model spans go under: an ensemble's model span; None: the trace's root
    span: Any
    #: the Triton trace id of ``span``'s request (0 for the root)
    triton_id: int


class OtelExporter:
    """The OpenTelemetry SDK pipeline (tracer provider, batch processor, OTLP/HTTP exporter) and the spans."""

    def __init__(self, config: Mapping[str, Any], next_id: Callable[[], int]) -> None:
        global propagation
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._kind = SpanKind.SERVER
        self._in_context = set_span_in_context
        self._propagator = TraceContextTextMapPropagator()
        self._next_id = next_id
        self.url = endpoint(str(config.get("url", DEFAULT_URL)))
        resource = {**DEFAULT_RESOURCE, **dict(config.get("resource", {}))}
        # shutdown_on_exit off: shutdown() bounds the final export itself (a collector that is down would hold
        # the interpreter's exit for the exporter's retries otherwise)
        self._provider = TracerProvider(resource=Resource.create(resource), shutdown_on_exit=False)
        self._processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=self.url),
            max_queue_size=config.get("bsp_max_queue_size"),
            schedule_delay_millis=config.get("bsp_schedule_delay"),
            max_export_batch_size=config.get("bsp_max_export_batch_size"),
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer(TRACER_NAME)
        #: monotonic ns + offset = wall-clock ns
        self._offset = time.time_ns() - time.monotonic_ns()
        self._lock = threading.Lock()
        self._closed = False
        #: Triton trace id → the frame of each model span now open, for BLS requests naming their parent's
        self._open: dict[int, _Frame] = {}
        propagation = True

    def wall(self, monotonic_ns: int) -> int:
        return monotonic_ns + self._offset

    # ---- sampling ---------------------------------------------------------------------------------
    def _remote_context(self) -> Any | None:
        carried = _incoming.get()
        if carried is None:
            return None
        carrier = {"traceparent": carried[0]}
        if carried[1]:
            carrier["tracestate"] = carried[1]
        from opentelemetry.trace import get_current_span

        context = self._propagator.extract(carrier)
        return context if get_current_span(context).get_span_context().is_valid else None

    def propagated(self) -> bool:
        """The request this task serves carries a valid W3C context (traced whatever the rate and count)."""
        return self._remote_context() is not None

    def start(self, trace_id: int) -> None:
        """A sampled request begins: its ``InferRequest`` span, under the caller's span when one came along."""
        _active.set(_Frame(_Trace(trace_id, self._remote_context()), None, 0))

    def finish(self, trace_id: int, request: InferenceRequest, response: InferenceResponse | None, end_ns: int) -> None:
        """The request ended: a model span for it when no registry call made one, then the ``InferRequest``
        span ends."""
        frame = _active.get()
        if frame is None or frame.trace.trace_id != trace_id or frame.span is not None:
            return
        _active.set(None)
        if not frame.trace.model_spans:
            span = self._model_span(frame, request)
            self._end_model_span(span, request, response, end_ns)
        frame.trace.root.end(end_time=self.wall(end_ns))

    # ---- streamed requests (not routed through the registry's infer) -----------------------------------
    def open_stream(self, trace_id: int, request: InferenceRequest) -> tuple[_Frame, Token[_Frame | None]]:
        """A sampled streamed request begins: its ``InferRequest`` and model spans now, and the model span is the
        current one until the token is reset (``leave``), so that the tasks its start makes (the model's run, an
        ensemble's steps) put their spans under it, and no later request of the same task does."""
        outer = _Frame(_Trace(trace_id, self._remote_context()), None, 0)
        frame = _Frame(outer.trace, self._model_span(outer, request, trace_id), trace_id)
        self._open[trace_id] = frame
        request.trace_id = trace_id
        return frame, _active.set(frame)

    @staticmethod
    def leave(token: Token[_Frame | None]) -> None:
        _active.reset(token)

    def close_stream(
        self, frame: _Frame, request: InferenceRequest, response: InferenceResponse | None, end_ns: int
    ) -> None:
        """The streamed request ended (final response handed on, or cancelled): its model and root spans end."""
        self._open.pop(frame.triton_id, None)
        self._end_model_span(frame.span, request, response, end_ns)
        frame.trace.root.end(end_time=self.wall(end_ns))

    # ---- model requests (the registry's infer, wrapped) --------------------------------------------
    async def around(self, request: InferenceRequest, route: Route) -> InferenceResponse:
        """The registry's ``around_infer``: a model span (and its compute span) for each request of a traced one,
        the request itself and an ensemble's steps (they run in tasks that inherit this context)."""
        frame = _active.get()
        if frame is None:
            return await route(request)
        triton_id = frame.trace.trace_id if frame.span is None else self._next_id()
        span = self._model_span(frame, request, triton_id)
        inner = self._open[triton_id] = _Frame(frame.trace, span, triton_id)
        request.trace_id = triton_id
        token = _active.set(inner)
        response = None
        try:
            response = await route(request)
            return response
        finally:
            _active.reset(token)
            self._open.pop(triton_id, None)
            self._end_model_span(span, request, response, time.monotonic_ns())

    #: the registry's ``around_infer`` is this exporter: called, it wraps a routed request
    __call__ = around

    def bls(self, parent: int, request: InferenceRequest, start: StartStream) -> tuple[ResponseStream, EndSpan | None]:
        """A Python model's BLS request made with its request's trace (``trace=request.trace()``): a model span
        under that request's, current while the request starts (its ensemble steps and the tasks they make go
        under it), ended by the returned callable (once: the caller's final response or cancel)."""
        frame = self._open.get(parent)
        if frame is None:  # the parent was not traced, or its span has ended
            return start(request), None
        triton_id = self._next_id()
        child = _Frame(frame.trace, self._model_span(frame, request, triton_id), triton_id)
        self._open[triton_id] = child
        request.trace_id = triton_id

        version = request.model_version

        def end(response: InferenceResponse | None) -> None:
            if self._open.pop(triton_id, None) is not None:
                self._end_model_span(child.span, request, response, time.monotonic_ns(), version)

        token = _active.set(child)
        try:
            stream = start(request)
        except BaseException:  # refused before it ran: its span ends here
            end(None)
            raise
        finally:
            _active.reset(token)
        version = stream.model_version  # a flag-only final response names no version: the stream's is the one
        return stream, end

    def _model_span(self, frame: _Frame, request: InferenceRequest, triton_id: int | None = None) -> Any:
        trace = frame.trace
        trace.model_spans += 1
        if trace.root is None:
            trace.root = self._tracer.start_span(
                ROOT_SPAN, context=trace.remote, kind=self._kind, start_time=self.wall(request.received_ns)
            )
        span = self._tracer.start_span(
            request.model_name,
            context=self._in_context(trace.root if frame.span is None else frame.span),
            kind=self._kind,
            start_time=self.wall(request.received_ns),
        )
        span.set_attribute("triton.model_name", request.model_name)
        span.set_attribute("triton.trace_id", frame.trace.trace_id if triton_id is None else triton_id)
        span.set_attribute("triton.trace_parent_id", frame.triton_id)
        if request.id:
            span.set_attribute("triton.request_id", request.id)
        span.add_event("REQUEST_START", timestamp=self.wall(request.received_ns))
        return span

    def _end_model_span(
        self,
        span: Any,
        request: InferenceRequest,
        response: InferenceResponse | None,
        end_ns: int,
        version: str | None = None,
    ) -> None:
        if response is not None:
            version = response.model_version
        elif version is None:
            version = request.model_version
        span.set_attribute("triton.model_version", int(version) if str(version).isdigit() else -1)
        if request.queued_ns:
            span.add_event("QUEUE_START", timestamp=self.wall(request.queued_ns))
        if request.compute_start_ns:
            start = request.compute_start_ns
            compute = self._tracer.start_span(
                COMPUTE_SPAN, context=self._in_context(span), kind=self._kind, start_time=self.wall(start)
            )
            compute.add_event("COMPUTE_START", timestamp=self.wall(start))
            timings: ExecutionTimings | None = request.timings
            compute_end = end_ns
            if timings is not None:
                input_end = start + timings.compute_input_ns
                output_start = input_end + timings.compute_infer_ns
                compute_end = output_start + timings.compute_output_ns
                compute.add_event("COMPUTE_INPUT_END", timestamp=self.wall(input_end))
                compute.add_event("COMPUTE_OUTPUT_START", timestamp=self.wall(output_start))
            compute.add_event("COMPUTE_END", timestamp=self.wall(compute_end))
            compute.end(end_time=self.wall(compute_end))
        span.add_event("REQUEST_END", timestamp=self.wall(end_ns))
        span.end(end_time=self.wall(end_ns))

    def shutdown(self) -> None:
        """Export what is queued and stop (at server shutdown)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True

        def stop() -> None:
            try:
                self._provider.shutdown()
            except Exception as exc:  # the exporter already logged what failed; shutdown goes on
                log.warning("OpenTelemetry exporter shutdown: %s", exc)

        # the exporter retries an unreachable collector for up to its timeout (10 s) per batch: the server's
        # shutdown waits SHUTDOWN_WAIT_S at most
        thread = threading.Thread(target=stop, name="otel-shutdown", daemon=True)
        thread.start()
        thread.join(SHUTDOWN_WAIT_S)
        if thread.is_alive():
            log.warning(
                "OpenTelemetry: queued spans dropped: %s did not take them within %gs", self.url, SHUTDOWN_WAIT_S
            )
