"""Triton's trace extension: sampled request traces written as Triton's JSON trace file, or exported as
OpenTelemetry spans (``trace_mode`` ``opentelemetry``: see otel.py).

Semantics (docs/protocol/extension_trace.md, docs/user_guide/trace.md):

* Settings ``trace_level`` (list: OFF, TIMESTAMPS, TENSORS), ``trace_rate`` (trace every N-th request),
  ``trace_count`` (traces left to take, -1 = no limit), ``log_frequency`` (write every N traces to
  ``<trace_file>.<index>``; 0 = write ``<trace_file>`` at shutdown), ``trace_file`` and ``trace_mode``
  (``triton`` or ``opentelemetry``, set at start only). Values travel as strings (lists for ``trace_level``),
  as Triton sends them.
* Settings are global, and may be overridden per model: the first update for a model copies every
  setting it does not name from the global ones; a ``null`` value removes a model's override of that
  setting (the global value applies again).
* When ``trace_count`` reaches 0 the collected traces are written at once, whatever ``log_frequency``.
* The file is a JSON array of Triton's records: ``{"id", "model_name", "model_version", "request_id"}``,
  then one ``{"id", "timestamps": [{"name", "ns"}]}`` per timestamp (REQUEST_START, QUEUE_START,
  COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END), and with TENSORS
  ``{"id", "activity": "TENSOR_QUEUE_INPUT" | "TENSOR_BACKEND_OUTPUT", "tensor": {"name", "data", "shape",
  "dtype"}}``. Timestamps are this process's monotonic clock in ns, as Triton's steady clock.

``trace_file`` can be set on the command line only (``--trace-config triton,file=...``); through the API
it is refused as Triton 2.51 refuses it (501 "trace file location can not be updated through network
protocol"), and enabling a level without a file is refused with Triton's "trace file name is not given".
In the OpenTelemetry mode no file is written and none is needed (otel.py). Streamed requests (gRPC streams, decoupled
models, generate) are traced in both modes (``Tracer.stream``), ending when their final response was handed on;
with TENSORS the trace file holds the last response's outputs. HTTP/gRPC transport timestamps
(HTTP_RECV_START, ...) are not recorded: a trace starts when the request reaches the server core.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..vocabulary import tensors
from ..vocabulary.errors import InvalidArgument, Unsupported
from ..vocabulary.registry_view import RegistryView
from ..vocabulary.streaming import ResponseStream
from ..vocabulary.types import ExecutionTimings, InferenceRequest, InferenceResponse
from .otel import OtelExporter
from .otel import parse_setting as parse_otel_setting

log = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
SETTINGS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")
#: Triton's defaults (docs/user_guide/trace.md "Global Settings")
DEFAULTS: dict[str, Any] = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}


def _int_setting(name: str, value: Any, minimum: int) -> str:
    text = value[0] if isinstance(value, list) and len(value) == 1 else value
    try:
        number = int(str(text))
    except ValueError:
        raise InvalidArgument(f"trace setting '{name}' must be an integer, got {value!r}") from None
    if number < minimum:
        raise InvalidArgument(f"trace setting '{name}' must be at least {minimum}, got {number}")
    return str(number)


def check_setting(name: str, value: Any) -> Any:
    """The normalized value of one setting (strings, a list for trace_level); raises InvalidArgument."""
    if name == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if not levels or not all(isinstance(v, str) and v.upper() in LEVELS for v in levels):
            raise InvalidArgument(f"trace setting 'trace_level' must be a list of {', '.join(LEVELS)}, got {value!r}")
        upper = [v.upper() for v in levels]
        return ["OFF"] if "OFF" in upper and len(upper) == 1 else [v for v in upper if v != "OFF"] or ["OFF"]
    if name == "trace_rate":
        return _int_setting(name, value, 1)
    if name == "trace_count":
        return _int_setting(name, value, -1)
    if name == "log_frequency":
        return _int_setting(name, value, 0)
    if name == "trace_mode":
        mode = value[0] if isinstance(value, list) and len(value) == 1 else value
        if mode not in ("triton", "opentelemetry"):
            raise InvalidArgument(f"trace_mode '{mode}' is not supported: the modes are triton and opentelemetry")
        return mode
    if name == "trace_file":
        return value[0] if isinstance(value, list) and len(value) == 1 else str(value)
    raise InvalidArgument(f"unknown trace setting '{name}': the settings are {', '.join(SETTINGS)}")


class StreamTrace:
    """One traced streamed request, as its front end sees it: ``end`` once its final response was handed on or its
    stream was cancelled (later calls do nothing)."""

    __slots__ = ("_close", "_ended")

    def __init__(self, close: Callable[[InferenceResponse | None, int], None]) -> None:
        self._close = close
        self._ended = False

    def end(self, response: InferenceResponse | None) -> None:
        """``response``: the request's last response (its model version, its outputs), None when it sent none."""
        if not self._ended:
            self._ended = True
            self._close(response, time.monotonic_ns())


@dataclass
class _Scope:
    """One set of settings (the global one, or a model's) and what it collected."""

    settings: dict[str, Any]
    seen: int = 0
    traces: list[list[dict[str, Any]]] = field(default_factory=list)


class Tracer:
    """Decides which requests to trace, records them, and writes the trace files."""

    def __init__(self, settings: dict[str, Any] | None = None, registry: RegistryView | None = None) -> None:
        """``settings`` as ``parse_trace_config`` gives them (``opentelemetry``: that mode's own settings);
        ``registry``: in the OpenTelemetry mode its ``around_infer`` (the exporter) gives every model request of a
        traced one (an ensemble's steps, a Python model's BLS requests made with its trace) its span."""
        base = dict(DEFAULTS)
        otel_config = dict((settings or {}).get("opentelemetry") or {})
        for name, value in (settings or {}).items():
            if name != "opentelemetry":
                base[name] = check_setting(name, value)
        self._global = _Scope(base)
        self._models: dict[str, _Scope] = {}
        self._next_id = 1
        #: next index per trace file: scopes sharing a file (a model's copy of the global one) never overwrite
        self._file_index: dict[str, int] = {}
        self._lock = threading.Lock()
        self.otel: OtelExporter | None = None
        if base["trace_mode"] == "opentelemetry":
            self.otel = OtelExporter(otel_config, self._new_id)
            if registry is not None:
                registry.around_infer = self.otel

    def _new_id(self) -> int:
        with self._lock:
            trace_id = self._next_id
            self._next_id += 1
            return trace_id

    # ---- settings (the extension's GET and POST) --------------------------------------------------
    def settings(self, model: str = "") -> dict[str, Any]:
        scope = self._models.get(model, self._global) if model else self._global
        return {name: (list(v) if isinstance(v, list) else v) for name, v in scope.settings.items()}

    def update(self, updates: dict[str, Any], model: str = "") -> dict[str, Any]:
        """Apply a POST; returns the settings now in force for ``model`` (or globally)."""
        for name in updates:
            if name not in SETTINGS:
                raise InvalidArgument(f"unknown trace setting '{name}': the settings are {', '.join(SETTINGS)}")
            if name == "trace_file":
                # Triton 2.51's words and status (501): set it with --trace-config triton,file=<path>
                raise Unsupported("trace file location can not be updated through network protocol")
            if name == "trace_mode" and updates[name] is not None:
                if check_setting(name, updates[name]) != self._global.settings["trace_mode"]:
                    raise InvalidArgument("trace_mode can only be set at start (--trace-config mode=<mode>)")
        with self._lock:
            checked = {n: (None if v is None else check_setting(n, v)) for n, v in updates.items()}
            target = self._models.get(model) if model else self._global
            settings = dict(target.settings if target is not None else self._global.settings)
            for name, value in checked.items():
                fallback = self._global.settings[name] if model else DEFAULTS[name]
                settings[name] = fallback if value is None else value
            if settings["trace_level"] != ["OFF"] and not settings["trace_file"] and self.otel is None:
                # Triton refuses to trace into nowhere (checked side by side with Triton 2.51)
                raise InvalidArgument("Attempting to set invalid trace setting :trace file name is not given")
            if target is None:
                self._models[model] = _Scope(settings)
            else:
                target.settings = settings
            return self.settings(model)

    # ---- tracing requests ---------------------------------------------------------------------------
    def sample(self, model: str) -> int:
        """A trace id when this request of ``model`` is to be traced, else 0."""
        trace_id = self._sample(model)
        if trace_id and self.otel is not None:
            self.otel.start(trace_id)
        return trace_id

    def stream(
        self, request: InferenceRequest, start: Callable[[InferenceRequest], ResponseStream]
    ) -> tuple[ResponseStream, StreamTrace | None]:
        """Start a streamed request with ``start`` (the service's ``infer_stream``), traced when sampled: the
        stream, and the trace its front end ends (``StreamTrace.end``) once the request's final response was handed
        on or the stream was cancelled (None: not traced)."""
        trace_id = self._sample(request.model_name)
        if not trace_id:
            return start(request), None
        otel = self.otel
        if otel is None:
            trace = StreamTrace(lambda response, end_ns: self.record(trace_id, request, response, end_ns))
            try:
                return start(request), trace
            except BaseException:  # refused before it ran: the trace ends here
                trace.end(None)
                raise
        scope = self._models.get(request.model_name, self._global)
        frame, token = otel.open_stream(trace_id, request)

        def close(response: InferenceResponse | None, end_ns: int) -> None:
            otel.close_stream(frame, request, response, end_ns)
            self._count_down(scope)

        trace = StreamTrace(close)
        try:
            return start(request), trace
        except BaseException:
            trace.end(None)
            raise
        finally:
            otel.leave(token)

    def _sample(self, model: str) -> int:
        scope = self._models.get(model, self._global)
        s = scope.settings
        if s["trace_level"] == ["OFF"]:
            return 0
        otel = self.otel
        # OpenTelemetry: a request carrying the caller's context is traced whatever the rate and count (Triton)
        forced = otel is not None and otel.propagated()
        if s["trace_count"] == "0" and not forced:
            return 0
        with self._lock:
            scope.seen += 1
            if scope.seen % int(s["trace_rate"]) and not forced:
                return 0
            trace_id = self._next_id
            self._next_id += 1
        return trace_id

    def _count_down(self, scope: _Scope) -> None:
        """One trace taken: ``trace_count`` goes down unless it is -1 (no limit)."""
        with self._lock:
            count = int(scope.settings["trace_count"])
            if count > 0:
                scope.settings["trace_count"] = str(count - 1)

    def record(
        self,
        trace_id: int,
        request: InferenceRequest,
        response: InferenceResponse | None,
        end_ns: int,
    ) -> None:
        """Store a finished traced request (``response`` None when it failed)."""
        scope = self._models.get(request.model_name, self._global)
        if self.otel is not None:
            self.otel.finish(trace_id, request, response, end_ns)
            self._count_down(scope)
            return
        levels = scope.settings["trace_level"]
        version = response.model_version if response is not None else request.model_version
        records: list[dict[str, Any]] = [
            {
                "id": trace_id,
                "model_name": request.model_name,
                "model_version": int(version) if str(version).isdigit() else -1,
                "request_id": request.id,
            }
        ]
        if "TIMESTAMPS" in levels:
            records += [
                {"id": trace_id, "timestamps": [{"name": n, "ns": ns}]} for n, ns in _timestamps(request, end_ns)
            ]
        if "TENSORS" in levels:
            records += _tensor_records(trace_id, "TENSOR_QUEUE_INPUT", request.inputs)
            if response is not None:
                records += _tensor_records(trace_id, "TENSOR_BACKEND_OUTPUT", response.outputs)
        with self._lock:
            scope.traces.append(records)
            s = scope.settings
            count = int(s["trace_count"])
            if count > 0:
                s["trace_count"] = str(count - 1)
            frequency = int(s["log_frequency"])
            if s["trace_count"] == "0" or (frequency and len(scope.traces) >= frequency):
                self._write(scope, indexed=True)

    def flush(self) -> None:
        """Write what was collected (at shutdown): ``<trace_file>`` when log_frequency is 0; export the spans
        still queued in the OpenTelemetry mode."""
        if self.otel is not None:
            self.otel.shutdown()
        with self._lock:
            for scope in [self._global, *self._models.values()]:
                if scope.traces:
                    self._write(scope, indexed=int(scope.settings["log_frequency"]) > 0)

    def _write(self, scope: _Scope, indexed: bool) -> None:
        path = scope.settings["trace_file"]
        traces, scope.traces = scope.traces, []
        if not path:
            log.warning("dropping %d trace(s): no trace file is set (--trace-config triton,file=<path>)", len(traces))
            return
        if indexed:
            index = self._file_index.get(path, 0)
            self._file_index[path] = index + 1
            target = Path(f"{path}.{index}")
        else:
            target = Path(path)
        records = [r for trace in traces for r in trace]
        try:
            target.write_text(json.dumps(records, indent=0))
        except OSError as exc:
            log.error("cannot write trace file %s: %s", target, exc)


def _timestamps(request: InferenceRequest, end_ns: int) -> list[tuple[str, int]]:
    stamps = [("REQUEST_START", request.received_ns)]
    if request.queued_ns:
        stamps.append(("QUEUE_START", request.queued_ns))
    timings: ExecutionTimings | None = request.timings
    if request.compute_start_ns:
        start = request.compute_start_ns
        stamps.append(("COMPUTE_START", start))
        if timings is not None:
            input_end = start + timings.compute_input_ns
            output_start = input_end + timings.compute_infer_ns
            stamps += [
                ("COMPUTE_INPUT_END", input_end),
                ("COMPUTE_OUTPUT_START", output_start),
                ("COMPUTE_END", output_start + timings.compute_output_ns),
            ]
    stamps.append(("REQUEST_END", end_ns))
    return stamps


def _tensor_records(trace_id: int, activity: str, arrays: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    out = []
    for name, array in arrays.items():
        values = tensors.to_list(np.asarray(array))
        out.append(
            {
                "id": trace_id,
                "activity": activity,
                "tensor": {
                    "name": name,
                    "data": ",".join(str(v) for v in values),
                    "shape": ",".join(str(d) for d in array.shape),
                    "dtype": tensors.v2_datatype(np.asarray(array)),
                },
            }
        )
    return out


def parse_trace_config(items: list[str]) -> dict[str, Any]:
    """``--trace-config [<mode>,]<setting>=<value>`` (repeatable; ``level`` may repeat) → settings."""
    settings: dict[str, Any] = {}
    levels: list[str] = []
    otel_config: dict[str, Any] = {}
    names = {"rate": "trace_rate", "count": "trace_count", "level": "trace_level", "mode": "trace_mode"}
    for item in items:
        mode, _, rest = item.partition(",") if "," in item.split("=", 1)[0] else ("", "", item)
        key, sep, value = rest.partition("=")
        if not sep:
            raise ValueError(f"--trace-config '{item}': expected [<mode>,]<setting>=<value>")
        if mode not in ("", "triton", "opentelemetry"):
            raise ValueError(f"--trace-config '{item}': unknown trace mode '{mode}'")
        if mode == "opentelemetry":
            try:
                parse_otel_setting(otel_config, key, value)
            except ValueError as exc:
                raise ValueError(f"--trace-config '{item}': {exc}") from None
        elif mode == "triton" and key in ("file", "log-frequency"):
            settings["trace_file" if key == "file" else "log_frequency"] = value
        elif not mode and key in names:
            if key == "level":
                levels.append(value)
            else:
                settings[names[key]] = value
        else:
            raise ValueError(f"--trace-config '{item}': unknown setting '{key}'")
    if levels:
        settings["trace_level"] = levels
    try:
        checked = {name: check_setting(name, value) for name, value in settings.items()}
    except InvalidArgument as exc:
        raise ValueError(f"--trace-config: {exc.message}") from None
    if otel_config:
        checked["opentelemetry"] = otel_config
    return checked
