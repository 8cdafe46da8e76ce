"""The one internal request/response shape that both front ends translate to and from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .streaming import ResponseStream


@dataclass(slots=True)
class ExecutionTimings:
    """Nanosecond durations of one execution, split as Triton reports them."""

    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


@dataclass(slots=True)
class InferenceRequest:
    model_name: str
    model_version: str = ""  # "" = the default (highest ready) version
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: names of the outputs to return; None = every output of the model
    requested_outputs: list[str] | None = None
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    #: 0 = the model's default priority level
    priority: int = 0
    #: 0 = the queue policy's default timeout
    timeout_us: int = 0
    received_ns: int = field(default_factory=time.monotonic_ns)
    #: set by the scheduler: when the request entered its queue and when its batch started computing
    queued_ns: int = 0
    compute_start_ns: int = 0
    #: the timings of the batch this request executed in (shared by the batch's requests)
    timings: ExecutionTimings | None = None
    #: set when the client went away (gRPC cancel, closed connection, stream cancel); models read it
    #: through ``is_cancelled()``, schedulers drop a cancelled request that has not started
    cancelled: bool = False
    #: set by the registry: the request named no version and the model's traffic weights chose this one
    #: (``kubeinfer.version_traffic``); its statistics count it apart, so that callers naming a version
    #: cannot steer the operator's canary judgement
    routed: bool = False
    #: where a decoupled model's responses go (set by the runtime for decoupled models only)
    stream: ResponseStream | None = None
    #: set by the OpenTelemetry tracer while this request's model span is open: its Triton trace id (0: not
    #: traced); a Python model's BLS request made with ``trace=request.trace()`` becomes a child span of it
    trace_id: int = 0

    def batch_size(self, max_batch_size: int) -> int:
        """Rows in this request: the first dim of any input when the model batches, else 1."""
        if max_batch_size <= 0 or not self.inputs:
            return 1
        first = next(iter(self.inputs.values()))
        return int(first.shape[0]) if first.ndim else 1


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    #: per output, the class labels from its ``label_filename`` (classification extension)
    labels: dict[str, list[str]] = field(default_factory=dict)
