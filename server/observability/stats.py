"""Per model version counters in Triton's statistics-extension shape.

Every number the statistics API and the Prometheus metrics report is recorded here, once; metric
exporters subscribe as listeners so the two can never disagree.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..vocabulary.statistics import LATENCY_KEY, ROUTED_KEY
from ..vocabulary.types import ExecutionTimings, InferenceRequest
from .metrics import LATENCY_BUCKETS_US


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class RoutedStats:
    """The requests the traffic weights sent to a version (``InferenceRequest.routed``): their own counts and
    latency histogram (the metrics' buckets), since the row's others also count callers that name the
    version, who are outside the weighted split and would steer the operator's canary judgement."""

    __slots__ = ("success", "fail", "counts")

    def __init__(self) -> None:
        self.success = Duration()
        self.fail = Duration()
        self.counts = [0] * (len(LATENCY_BUCKETS_US) + 1)  # last = +Inf

    def add(self, success: bool, total_ns: int) -> None:
        (self.success if success else self.fail).add(total_ns)
        self.counts[bisect_left(LATENCY_BUCKETS_US, total_ns / 1000)] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "success": self.success.as_dict(),
            "fail": self.fail.as_dict(),
            LATENCY_KEY: {"bounds_us": list(LATENCY_BUCKETS_US), "counts": list(self.counts)},
        }


class StatsListener(Protocol):
    def on_request(
        self,
        model: str,
        version: str,
        success: bool,
        total_ns: int,
        queue_ns: int,
        timings: ExecutionTimings | None,
        reason: str,
        first_response_ns: int | None,
    ) -> None: ...

    def on_execution(self, model: str, version: str, batch_size: int, timings: ExecutionTimings) -> None: ...


class ModelStats:
    """Counters of one model version. Updated on the event loop and from instance threads."""

    def __init__(self, model: str, version: str, listeners: list[StatsListener] | None = None) -> None:
        self.model = model
        self.version = version
        self.listeners = listeners if listeners is not None else []
        #: called with the duration (ns) of the version's first successful request (its cold start's last phase)
        self.on_first_success: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.batch_stats: dict[int, BatchStats] = {}
        #: Triton's ``memory_usage`` entries: what loading this version took (set by the model cache)
        self.memory_usage: list[dict[str, Any]] = []
        #: made at the first request the traffic weights send here: rows of unweighted models stay as they were
        self.routed: RoutedStats | None = None

    def record_execution(self, batch_size: int, timings: ExecutionTimings) -> None:
        with self._lock:
            self.execution_count += 1
            self.inference_count += batch_size
            b = self.batch_stats.get(batch_size)
            if b is None:  # not setdefault: it would build a BatchStats per call, most of this call's cost
                b = self.batch_stats[batch_size] = BatchStats()
            b.compute_input.add(timings.compute_input_ns)
            b.compute_infer.add(timings.compute_infer_ns)
            b.compute_output.add(timings.compute_output_ns)
        for listener in self.listeners:
            listener.on_execution(self.model, self.version, batch_size, timings)

    def record_request(self, request: InferenceRequest, success: bool, reason: str = "") -> None:
        total = time.monotonic_ns() - request.received_ns
        queue_ns = (request.compute_start_ns - request.queued_ns) if request.compute_start_ns else 0
        timings = request.timings
        # Triton's first-response time: a decoupled model's first response (or error) on its stream; -1 when
        # it sent only a flag-only final; a non-decoupled request's one response is being sent now (total)
        stream = request.stream
        if stream is None:
            first_response = total
        elif stream.first_ns:
            first_response = stream.first_ns - request.received_ns
        else:
            first_response = -1 if success else total  # a failure's error response follows this record
        first = False
        with self._lock:
            self.last_inference_ms = int(time.time() * 1000)
            if success:
                first = not self.success.count
                self._record_success(total, queue_ns, timings)
            else:
                self.fail.add(total)
            if request.routed:
                if self.routed is None:
                    self.routed = RoutedStats()
                self.routed.add(success, total)
        for listener in self.listeners:
            listener.on_request(self.model, self.version, success, total, queue_ns, timings, reason, first_response)
        if first and self.on_first_success is not None:
            self.on_first_success(total)

    def _record_success(self, total_ns: int, queue_ns: int, timings: ExecutionTimings | None) -> None:
        """One successful request's durations (under the lock). Fields updated in place rather than through
        five ``Duration.add`` calls: this runs once per request (README 'Performance against Triton and MLServer')."""
        success, queue = self.success, self.queue
        success.count += 1
        success.ns += total_ns
        queue.count += 1
        queue.ns += queue_ns
        if timings is not None:
            c_in, c_infer, c_out = self.compute_input, self.compute_infer, self.compute_output
            c_in.count += 1
            c_in.ns += timings.compute_input_ns
            c_infer.count += 1
            c_infer.ns += timings.compute_infer_ns
            c_out.count += 1
            c_out.ns += timings.compute_output_ns

    def record_cache(self, hit: bool, ns: int) -> None:
        """A response-cache lookup: on a hit the lookup time, on a miss lookup plus insertion (Triton's
        ``cache_hit`` / ``cache_miss``; a hit is also a successful request, recorded by record_request)."""
        with self._lock:
            (self.cache_hit if hit else self.cache_miss).add(ns)
        for listener in self.listeners:
            on_cache = getattr(listener, "on_cache", None)
            if on_cache is not None:
                on_cache(self.model, self.version, hit, ns)

    def as_dict(self) -> dict[str, Any]:
        """One entry of Triton's ``model_stats`` list."""
        with self._lock:
            return {
                "name": self.model,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.as_dict(),
                    "fail": self.fail.as_dict(),
                    "queue": self.queue.as_dict(),
                    "compute_input": self.compute_input.as_dict(),
                    "compute_infer": self.compute_infer.as_dict(),
                    "compute_output": self.compute_output.as_dict(),
                    "cache_hit": self.cache_hit.as_dict(),
                    "cache_miss": self.cache_miss.as_dict(),
                },
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": b.compute_input.as_dict(),
                        "compute_infer": b.compute_infer.as_dict(),
                        "compute_output": b.compute_output.as_dict(),
                    }
                    for size, b in sorted(self.batch_stats.items())
                ],
                "memory_usage": list(self.memory_usage),
            } | self._extensions()

    def _extensions(self) -> dict[str, Any]:
        """kubeinfer's additions to the HTTP rows (under the lock): the latency histogram, and once the traffic
        weights sent this version a request, the numbers the operator judges a canary by (``RoutedStats``)."""
        return self._latency() | ({ROUTED_KEY: self.routed.as_dict()} if self.routed is not None else {})

    def _latency(self) -> dict[str, Any]:
        """kubeinfer's addition to the HTTP rows (gRPC keeps Triton's fields): the request latency histogram
        a listener keeps (the metrics'), so that a reader of one model's statistics gets its p99."""
        for listener in self.listeners:
            histogram = getattr(listener, "request_latency", None)
            found = histogram(self.model, self.version) if histogram is not None else None
            if found is not None:
                bounds, counts = found
                return {LATENCY_KEY: {"bounds_us": bounds, "counts": counts}}
        return {}
