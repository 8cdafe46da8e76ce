"""Prometheus metrics with Triton's names, fed by the same records as the statistics API.

Counters, the pending-request gauge and latency histograms are labelled ``model`` and ``version``;
``nv_inference_request_failure`` adds ``reason`` (REJECTED, CANCELED, BACKEND, OTHER).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..core.types import ExecutionTimings

LABELS = ("model", "version")
#: request/queue latency buckets in microseconds: 100 µs … 60 s
LATENCY_BUCKETS_US = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 60_000_000,
)


class TritonMetrics:
    """A StatsListener that turns request and execution records into Prometheus series."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.success = Counter("nv_inference_request_success", "Number of successful inference requests, "
                               "all batch sizes", LABELS, registry=r)
        self.failure = Counter("nv_inference_request_failure", "Number of failed inference requests, all batch "
                               "sizes", (*LABELS, "reason"), registry=r)
        self.count = Counter("nv_inference_count", "Number of inferences performed (batch-expanded: a batch of "
                             "8 counts 8)", LABELS, registry=r)
        self.exec_count = Counter("nv_inference_exec_count", "Number of model executions performed (a batch "
                                  "counts 1)", LABELS, registry=r)
        self.request_us = Counter("nv_inference_request_duration_us", "Cumulative inference request duration in "
                                  "microseconds (includes cached and failed requests)", LABELS, registry=r)
        self.queue_us = Counter("nv_inference_queue_duration_us", "Cumulative inference queuing duration in "
                                "microseconds", LABELS, registry=r)
        self.input_us = Counter("nv_inference_compute_input_duration_us", "Cumulative compute input duration in "
                                "microseconds", LABELS, registry=r)
        self.infer_us = Counter("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration "
                                "in microseconds", LABELS, registry=r)
        self.output_us = Counter("nv_inference_compute_output_duration_us", "Cumulative inference compute output "
                                 "duration in microseconds", LABELS, registry=r)
        self.pending = Gauge("nv_inference_pending_request_count", "Instantaneous number of pending requests "
                             "awaiting execution per-model", LABELS, registry=r)
        self.request_hist = Histogram("kubeinfer_inference_request_duration_us", "Inference request latency in "
                                      "microseconds (end to end inside the server)", LABELS,
                                      buckets=LATENCY_BUCKETS_US, registry=r)
        self.queue_hist = Histogram("kubeinfer_inference_queue_duration_us", "Time requests waited in the "
                                    "scheduler queue in microseconds", LABELS, buckets=LATENCY_BUCKETS_US,
                                    registry=r)
        self.load_failures = Counter("kubeinfer_model_load_failures", "Model version loads that failed",
                                     LABELS, registry=r)

    def on_request(self, model: str, version: str, success: bool, total_ns: int, queue_ns: int,
                   timings: ExecutionTimings | None, reason: str) -> None:
        total_us = total_ns / 1000
        self.request_us.labels(model, version).inc(total_us)
        self.request_hist.labels(model, version).observe(total_us)
        if success:
            self.success.labels(model, version).inc()
            self.queue_us.labels(model, version).inc(queue_ns / 1000)
            self.queue_hist.labels(model, version).observe(queue_ns / 1000)
            if timings is not None:
                self.input_us.labels(model, version).inc(timings.compute_input_ns / 1000)
                self.infer_us.labels(model, version).inc(timings.compute_infer_ns / 1000)
                self.output_us.labels(model, version).inc(timings.compute_output_ns / 1000)
        else:
            self.failure.labels(model, version, reason or "OTHER").inc()

    def on_execution(self, model: str, version: str, batch_size: int, timings: ExecutionTimings) -> None:
        self.count.labels(model, version).inc(batch_size)
        self.exec_count.labels(model, version).inc()

    def on_load_failure(self, model: str, version: str, reason: str) -> None:
        self.load_failures.labels(model, version).inc()

    def refresh(self, model_registry: Any) -> None:
        """Read each serving version's queue length at scrape time (no bookkeeping on the hot path)."""
        self.pending.clear()
        for name in model_registry.model_names():
            for mv in model_registry.ready_versions(name):
                self.pending.labels(name, mv.version_str).set(mv.scheduler.pending)
