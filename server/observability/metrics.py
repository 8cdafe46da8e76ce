"""Prometheus metrics with Triton's names, fed by the same records as the statistics API.

Triton exposes its counters without the ``_total`` suffix that prometheus-client's ``Counter`` adds
(``nv_inference_request_success{model="m",version="1"} 10``); dashboards and HPA rules written for
Triton query those exact names, so the series are produced by a collector of our own. Recording is a
few float additions per request on the event loop; formatting happens only at scrape time.

Series labelled ``model`` and ``version`` (``nv_inference_request_failure`` adds ``reason``:
REJECTED, CANCELED, BACKEND, OTHER); host gauges come from /proc, GPU gauges from NVML when present.
Triton's opt-in latency summaries and first-response histogram (``--metrics-config``) are recorded from
the same calls; see ``latencies.py``.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..scheduling.base import Scheduler
from ..vocabulary.types import ExecutionTimings
from .latencies import (
    CACHE_SUMMARIES,
    FIRST_RESPONSE_BUCKETS_MS,
    FIRST_RESPONSE_FAMILY,
    FIRST_RESPONSE_HELP,
    SUMMARIES,
    MetricsConfig,
    SummaryWindow,
    WindowView,
    compact,
    first_response_buckets,
    format_number,
    window_quantiles,
)
from .system import CpuUtilization, GpuReader, cpu_memory


class ServingVersion(Protocol):
    """What a scrape reads of one serving model version (``runtime.model.ModelVersion``)."""

    version_str: str
    scheduler: Scheduler


class ServingModels(Protocol):
    """What a scrape reads of the registry (``runtime.registry.ModelRegistry``; observability sits beside
    the runtime, which imports it, so it names the registry by this protocol)."""

    def model_names(self) -> Iterable[str]: ...

    def ready_versions(self, name: str) -> Iterable[ServingVersion]: ...


FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_NAN = float("nan")
#: request/queue latency buckets in microseconds: 100 µs … 60 s
LATENCY_BUCKETS_US = (
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    60_000_000,
)
#: cold-start phase buckets in seconds: 10 ms … 10 min
LOAD_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

#: (attribute, name, help) of the per-model counters, in Triton's order
COUNTERS = (
    ("success", "nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("count", "nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    (
        "exec_count",
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "request_us",
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "queue_us",
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "input_us",
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "infer_us",
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "output_us",
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)


#: (attribute, name, help) of the per-model response-cache counters (Triton: docs/user_guide/metrics.md)
CACHE_COUNTERS = (
    ("cache_hits", "nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("cache_misses", "nv_cache_num_misses_per_model", "Number of cache misses per model"),
    (
        "cache_hit_us",
        "nv_cache_hit_duration_per_model",
        "Cumulative time requests spend retrieving a cached response per model on cache hits (microseconds)",
    ),
    (
        "cache_miss_us",
        "nv_cache_miss_duration_per_model",
        "Cumulative time requests spend looking up and inserting responses into the cache on a cache miss "
        "(microseconds)",
    ),
)


class _Histogram:
    __slots__ = ("buckets", "sum", "count", "bounds")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_US) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # last = +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class _Series:
    """Every number exported for one (model, version)."""

    __slots__ = (
        "success",
        "count",
        "exec_count",
        "request_us",
        "queue_us",
        "input_us",
        "infer_us",
        "output_us",
        "failure",
        "request_hist",
        "queue_hist",
        "load_failures",
        "cache_hits",
        "cache_misses",
        "cache_hit_us",
        "cache_miss_us",
        "success_us",
        "timed",
        "window",
        "view",
        "cache_windows",
        "cache_views",
        "first_response",
    )

    def __init__(self) -> None:
        self.success = self.count = self.exec_count = 0
        #: with summaries on: µs of the successful requests, and how many of them executed (have timings), the
        #: summaries' sums and counts (the counters' request_us also counts failures)
        self.success_us = 0.0
        self.timed = 0
        #: the summaries' observations (summary_latencies=true), made at the first successful request
        self.window: SummaryWindow | None = None
        #: in a scrape's snapshot: what it reads of ``window``
        self.view: WindowView | None = None
        #: the cache summaries' observations (hit, miss; summary_latencies=true), made at the first lookup
        self.cache_windows: tuple[SummaryWindow, SummaryWindow] | None = None
        #: in a scrape's snapshot: what it reads of ``cache_windows``
        self.cache_views: tuple[WindowView, WindowView] | None = None
        #: first-response histogram (histogram_latencies=true), made at the first response
        self.first_response: _Histogram | None = None
        self.cache_hits = self.cache_misses = 0
        self.cache_hit_us = self.cache_miss_us = 0.0
        self.request_us = self.queue_us = self.input_us = self.infer_us = self.output_us = 0.0
        self.failure = dict.fromkeys(FAILURE_REASONS, 0)
        self.request_hist = _Histogram()
        self.queue_hist = _Histogram()
        self.load_failures = 0


class TritonMetrics(Collector):
    """A StatsListener that turns request and execution records into Prometheus series."""

    def __init__(self, registry: CollectorRegistry | None = None, config: MetricsConfig | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.config = config or MetricsConfig()
        self._summaries = self.config.summary_latencies
        self._histograms = self.config.histogram_latencies
        self._latencies = self._summaries or self._histograms
        #: (model, version) → first-response buckets from its config.pbtxt ``model_metrics``
        self._first_bounds: dict[tuple[str, str], tuple[float, ...]] = {}
        self._series: dict[tuple[str, str], _Series] = {}
        #: (model, version, phase) → seconds each cold start spent in that phase (``runtime.cold_start``)
        self._load_phases: dict[tuple[str, str, str], _Histogram] = {}
        #: (model, version) → load seconds (warm-up included) of the serving versions (Triton's gauge)
        self._load_seconds: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()  # scrapes may run while instance threads record
        self._custom: Any = None  # the registry's CustomMetrics (models' pb_utils.MetricFamily)
        #: the server's response cache (gauges), set by the wiring; None = no cache configured
        self.response_cache: Any = None
        #: the model cache (``runtime.model_cache.ModelCache``), set by the wiring; None = models load as usual
        self.model_cache: Any = None
        #: (model, version) with the cache enabled: their per-model cache counters are exported even at 0
        self._cached_models: set[tuple[str, str]] = set()
        self._cpu = CpuUtilization()
        self._gpus = GpuReader()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total

    def _get(self, model: str, version: str) -> _Series:
        s = self._series.get((model, version))
        if s is None:
            with self._lock:
                s = self._series.setdefault((model, version), _Series())
        return s

    # ---- StatsListener ---------------------------------------------------------------------
    def on_request(
        self,
        model: str,
        version: str,
        success: bool,
        total_ns: int,
        queue_ns: int,
        timings: ExecutionTimings | None,
        reason: str,
        first_response_ns: int | None = None,
    ) -> None:
        """``first_response_ns``: from arrival to the request's first response (None: ``total_ns``, the one
        response of a non-decoupled model; -1: it sent none, only a flag-only final)."""
        s = self._series.get((model, version)) or self._get(model, version)
        total_us = total_ns / 1000
        with self._lock:
            s.request_us += total_us
            s.request_hist.observe(total_us)
            if success:
                queue_us = queue_ns / 1000
                s.success += 1
                s.queue_us += queue_us
                s.queue_hist.observe(queue_us)
                if timings is not None:
                    s.input_us += timings.compute_input_ns / 1000
                    s.infer_us += timings.compute_infer_ns / 1000
                    s.output_us += timings.compute_output_ns / 1000
            else:
                key = reason if reason in s.failure else "OTHER"
                s.failure[key] += 1
            if self._latencies:  # one test when Triton's opt-in families are off
                first = total_ns if first_response_ns is None else first_response_ns
                self._observe_latencies(s, model, version, success, total_us, queue_ns, timings, first)

    def _observe_latencies(
        self,
        s: _Series,
        model: str,
        version: str,
        success: bool,
        total_us: float,
        queue_ns: int,
        timings: ExecutionTimings | None,
        first_response_ns: int,
    ) -> None:
        """Summaries and first-response histogram of one request (under the lock)."""
        if self._summaries and success:
            s.success_us += total_us
            if timings is not None:
                s.timed += 1
                row = (
                    total_us,
                    queue_ns / 1000,
                    timings.compute_input_ns / 1000,
                    timings.compute_infer_ns / 1000,
                    timings.compute_output_ns / 1000,
                )
            else:  # not executed (a cache hit): no compute observations
                row = (total_us, queue_ns / 1000, _NAN, _NAN, _NAN)
            window = s.window
            if window is None:
                window = s.window = SummaryWindow()
            window.observe(row)
        if self._histograms and first_response_ns >= 0:
            h = s.first_response
            if h is None:
                bounds = self._first_bounds.get((model, version), FIRST_RESPONSE_BUCKETS_MS)
                h = s.first_response = _Histogram(bounds)
            h.observe(first_response_ns // 1_000_000)  # whole ms, as Triton divides

    def on_execution(self, model: str, version: str, batch_size: int, timings: ExecutionTimings) -> None:
        s = self._get(model, version)
        with self._lock:
            s.count += batch_size
            s.exec_count += 1

    def on_cache(self, model: str, version: str, hit: bool, ns: int) -> None:
        s = self._get(model, version)
        with self._lock:
            us = ns / 1000
            if hit:
                s.cache_hits += 1
                s.cache_hit_us += us
            else:
                s.cache_misses += 1
                s.cache_miss_us += us
            if self._summaries:
                windows = s.cache_windows
                if windows is None:
                    windows = s.cache_windows = (SummaryWindow(1), SummaryWindow(1))
                windows[0 if hit else 1].observe((us,))

    def on_version_config(self, model: str, version: str, config: Any) -> None:
        """A version is being built from ``config``: its first-response buckets (config.pbtxt ``model_metrics``;
        raises ValueError for buckets Triton could not create). Changed buckets start the histogram anew."""
        buckets = first_response_buckets(config, self._histograms)
        bounds = buckets if buckets is not None else FIRST_RESPONSE_BUCKETS_MS
        with self._lock:
            if buckets is None:
                self._first_bounds.pop((model, version), None)
            else:
                self._first_bounds[(model, version)] = buckets
            s = self._series.get((model, version))
            if s is not None and s.first_response is not None and s.first_response.bounds != bounds:
                s.first_response = None

    def on_load_failure(self, model: str, version: str, reason: str) -> None:
        s = self._get(model, version)
        with self._lock:
            s.load_failures += 1

    def on_load_phase(self, model: str, version: str, phase: str, seconds: float) -> None:
        with self._lock:
            h = self._load_phases.get((model, version, phase))
            if h is None:
                h = self._load_phases[(model, version, phase)] = _Histogram(LOAD_BUCKETS_S)
            h.observe(seconds)

    def request_latency(self, model: str, version: str) -> tuple[list[int], list[int]] | None:
        """(bucket upper bounds in µs, requests per bucket with +Inf last) of one version, or None."""
        s = self._series.get((model, version))
        if s is None:
            return None
        with self._lock:
            return list(LATENCY_BUCKETS_US), list(s.request_hist.buckets)

    def refresh(self, model_registry: ServingModels) -> None:
        """At scrape time: queue lengths of the serving versions, and zero series for idle ones (as Triton)."""
        pending: dict[tuple[str, str], int] = {}
        load_seconds: dict[tuple[str, str], float] = {}
        for name in model_registry.model_names():
            for mv in model_registry.ready_versions(name):
                self._get(name, mv.version_str)
                pending[(name, mv.version_str)] = mv.scheduler.pending
                cold = getattr(mv, "cold_start", None)
                if cold is not None:
                    load_seconds[(name, mv.version_str)] = cold.load_seconds + cold.warmup_seconds
                if getattr(mv, "uses_cache", False):
                    self._cached_models.add((name, mv.version_str))
        self._pending = pending
        self._load_seconds = load_seconds
        self._custom = getattr(model_registry, "custom_metrics", None)

    # ---- Collector ---------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            items = [(k, _snapshot(s)) for k, s in sorted(self._series.items())]
            first_bounds = dict(self._first_bounds)
        counters = self.config.counter_latencies
        for attr, name, doc in COUNTERS[:1]:
            yield _family(name, doc, "counter", ((k, getattr(s, attr)) for k, s in items))
        failure = Metric(
            "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter"
        )
        for (model, version), s in items:
            for reason, value in s.failure.items():
                failure.add_sample(failure.name, {"model": model, "reason": reason, "version": version}, value)
        yield failure
        for attr, name, doc in COUNTERS[1:]:
            if counters or attr in ("count", "exec_count"):  # counter_latencies=false: the µs counters go
                yield _family(name, doc, "counter", ((k, getattr(s, attr)) for k, s in items))
        cached = [(k, s) for k, s in items if s.cache_hits or s.cache_misses or k in self._cached_models]
        for attr, name, doc in CACHE_COUNTERS if counters else ():  # Triton creates these with the µs counters
            yield _family(name, doc, "counter", ((k, getattr(s, attr)) for k, s in cached))
        if self._summaries:
            yield from self._summary_families(items)
            yield from self._cache_summary_families(cached)
        if self._histograms:
            m = Metric(FIRST_RESPONSE_FAMILY, FIRST_RESPONSE_HELP, "histogram")
            for (model, version), s in items:
                h = s.first_response or _Histogram(first_bounds.get((model, version), FIRST_RESPONSE_BUCKETS_MS))
                _add_histogram(m, {"model": model, "version": version}, h, format_number)
            yield m
        # Triton's redis cache reports no cache-wide gauges (its size and entries are Redis's): only the per-model
        # counters above
        if self.response_cache is not None and self.response_cache.enabled and not self.response_cache.remote:
            yield from self._cache_gauges()
        yield _family(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model",
            "gauge",
            sorted(self._pending.items()),
        )
        for attr, name, doc in (
            (
                "request_hist",
                "kubeinfer_inference_request_duration_us",
                "Inference request latency inside the server in microseconds (received to response ready)",
            ),
            (
                "queue_hist",
                "kubeinfer_inference_queue_duration_us",
                "Time successful requests waited in the scheduler queue in microseconds",
            ),
        ):
            yield _histogram(name, doc, ((k, getattr(s, attr)) for k, s in items))
        yield _family(
            "nv_model_load_duration_secs", "Model load time in seconds", "gauge", sorted(self._load_seconds.items())
        )
        with self._lock:
            phases = [(k, _copy(h)) for k, h in sorted(self._load_phases.items())]
        m = Metric(
            "kubeinfer_model_load_duration_seconds",
            "Seconds each model version's cold start spent per phase: load (folder read to instances loaded), "
            "warmup (its warm-up samples), first_inference (its first successful request)",
            "histogram",
        )
        for (model, version, phase), h in phases:
            _add_histogram(m, {"model": model, "phase": phase, "version": version}, h)
        yield m
        # at 0 for every version the server knows (a counter with known labels exists before its first increment),
        # so a query or a dashboard panel over it has a series before the first failure, not "no data"
        yield _family(
            "kubeinfer_model_load_failures",
            "Model version loads that failed",
            "counter",
            ((k, s.load_failures) for k, s in items),
        )
        if self.model_cache is not None:
            yield from _model_cache_metrics(self.model_cache)
        yield from self._system()
        yield from self._models_own()

    def _summary_families(self, items: list[tuple[tuple[str, str], _Series]]) -> Iterator[Metric]:
        """Triton's five summaries: ``_count`` and ``_sum`` since start from the counters' records, quantiles over
        the window (the request summary not for versions with the response cache, as Triton)."""
        qs = [q for q, _ in self.config.quantiles]
        labels_q = [format_number(q) for q in qs]
        nan = [_NAN] * len(qs)
        quantiles: dict[tuple[str, str], list[list[float]]] = {}
        to_compact = []
        for key, s in items:
            if s.view is not None:
                quantiles[key], compacted = window_quantiles(s.view, qs)
                to_compact += compacted
        if to_compact:
            with self._lock:
                compact(to_compact)
        for family, (name, doc) in enumerate(SUMMARIES):
            m = Metric(name, doc, "summary")
            for (model, version), s in items:
                if family == 0 and (model, version) in self._cached_models:
                    continue
                labels = {"model": model, "version": version}
                count, total = (
                    (s.success, s.success_us),
                    (s.success, s.queue_us),
                    (s.timed, s.input_us),
                    (s.timed, s.infer_us),
                    (s.timed, s.output_us),
                )[family]
                m.add_sample(f"{name}_count", labels, count)
                m.add_sample(f"{name}_sum", labels, total)
                values = quantiles[(model, version)][family] if (model, version) in quantiles else nan
                for q, value in zip(labels_q, values, strict=True):
                    m.add_sample(name, {**labels, "quantile": q}, value)
            yield m

    def _cache_summary_families(self, cached: list[tuple[tuple[str, str], _Series]]) -> Iterator[Metric]:
        """Triton's per-model cache summaries, for the versions that export the cache counters: ``_count`` and
        ``_sum`` since start are the counters' records, quantiles over the window."""
        qs = [q for q, _ in self.config.quantiles]
        labels_q = [format_number(q) for q in qs]
        nan = [_NAN] * len(qs)
        quantiles: dict[tuple[tuple[str, str], int], list[float]] = {}
        to_compact = []
        for key, s in cached:
            for which, view in enumerate(s.cache_views or ()):
                (quantiles[(key, which)],), compacted = window_quantiles(view, qs)
                to_compact += compacted
        if to_compact:
            with self._lock:
                compact(to_compact)
        for which, (name, doc) in enumerate(CACHE_SUMMARIES):
            m = Metric(name, doc, "summary")
            for (model, version), s in cached:
                labels = {"model": model, "version": version}
                count, total = (s.cache_hits, s.cache_hit_us) if which == 0 else (s.cache_misses, s.cache_miss_us)
                m.add_sample(f"{name}_count", labels, count)
                m.add_sample(f"{name}_sum", labels, total)
                values = quantiles.get(((model, version), which), nan)
                for q, value in zip(labels_q, values, strict=True):
                    m.add_sample(name, {**labels, "quantile": q}, value)
            yield m

    def _models_own(self) -> Iterator[Metric]:
        """Families Python models created (``pb_utils.MetricFamily``), under the names they chose."""
        if self._custom is None:
            return
        for name, description, kind, samples in self._custom.snapshot():
            m = Metric(name, description, kind)
            for sample_name, labels, value in samples:
                m.add_sample(sample_name, labels, value)
            yield m

    def _cache_gauges(self) -> Iterator[Metric]:
        cache = self.response_cache
        assert cache is not None
        for name, doc, value in (
            ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entries),
            ("nv_cache_num_lookups", "Number of cache lookups in response cache", cache.lookups),
            ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
            ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
            ("nv_cache_num_evictions", "Number of cache evictions in response cache", cache.evictions),
            (
                "nv_cache_lookup_duration",
                "Total cache lookup duration (hit and miss), in microseconds",
                cache.lookup_ns / 1000,
            ),
            (
                "nv_cache_insertion_duration",
                "Total cache insertion duration, in microseconds",
                cache.insertion_ns / 1000,
            ),
            ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.utilization),
        ):
            m = Metric(name, doc, "gauge")
            m.add_sample(name, {}, value)
            yield m

    def _system(self) -> Iterator[Metric]:
        util = self._cpu.read()
        if util is not None:
            m = Metric("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
            m.add_sample(m.name, {}, util)
            yield m
        mem = cpu_memory()
        if mem is not None:
            for name, doc, value in (
                ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", mem[0]),
                ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", mem[1]),
            ):
                m = Metric(name, doc, "gauge")
                m.add_sample(name, {}, value)
                yield m
        gpus = self._gpus.read()
        for attr, name, doc in (
            ("utilization", "nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)"),
            ("memory_total", "nv_gpu_memory_total_bytes", "GPU total memory, in bytes"),
            ("memory_used", "nv_gpu_memory_used_bytes", "GPU used memory, in bytes"),
            ("power_usage", "nv_gpu_power_usage", "GPU power usage in watts"),
            ("power_limit", "nv_gpu_power_limit", "GPU power management limit in watts"),
        ):
            if gpus:
                m = Metric(name, doc, "gauge")
                for g in gpus:
                    value = getattr(g, attr)
                    if value is not None:
                        m.add_sample(name, {"gpu_uuid": g.uuid}, value)
                yield m


#: (attribute of runtime.model_cache.CachedModel, name, help) of the model cache's per-model counters
MODEL_CACHE_COUNTERS = (
    ("loads", "kubeinfer_model_cache_loads", "Loads of the model by the model cache (on a request or explicit)"),
    ("load_seconds", "kubeinfer_model_cache_load_seconds", "Seconds the model cache spent loading the model"),
    ("hits", "kubeinfer_model_cache_hits", "Requests that found the model loaded"),
    ("waits", "kubeinfer_model_cache_waits", "Requests that waited for the model to load"),
    (
        "wait_failures",
        "kubeinfer_model_cache_wait_failures",
        "Requests that waited for the model to load and got an error (load failed, timed out, no room)",
    ),
)


def _model_cache_metrics(cache: Any) -> Iterator[Metric]:
    """The model cache's counters per model, its evictions by reason, and its gauges."""
    known = sorted(cache.known.items())
    for attr, name, doc in MODEL_CACHE_COUNTERS:
        m = Metric(name, doc, "counter")
        for model, state in known:
            m.add_sample(name, {"model": model}, getattr(state, attr))
        yield m
    m = Metric(
        "kubeinfer_model_cache_evictions",
        "Models unloaded by the model cache: to make room in the budget, or idle too long",
        "counter",
    )
    for model, state in known:
        m.add_sample(m.name, {"model": model, "reason": "budget"}, state.evictions_budget)
        m.add_sample(m.name, {"model": model, "reason": "idle"}, state.evictions_idle)
    yield m
    used = cache.used()
    for name, doc, value in (
        ("kubeinfer_model_cache_budget_bytes", "Host memory budget of the model cache (0: none)", cache.budget),
        ("kubeinfer_model_cache_used_bytes", "Host memory the loaded models took when they loaded", used.host),
        ("kubeinfer_model_cache_loaded_models", "Models loaded now", len(cache.loaded_names())),
    ):
        g = Metric(name, doc, "gauge")
        g.add_sample(name, {}, value)
        yield g
    g = Metric("kubeinfer_model_memory_bytes", "Memory each loaded model version took at its load", "gauge")
    for model in cache.loaded_names():
        for version, footprint in cache.footprints(model):
            g.add_sample(g.name, {"model": model, "version": version, "kind": "CPU", "device": "0"}, footprint.host)
            for device, size in sorted(footprint.gpu.items()):
                labels = {"model": model, "version": version, "kind": "GPU", "device": str(device)}
                g.add_sample(g.name, labels, size)
    yield g


def _snapshot(s: _Series) -> _Series:
    c = _Series()
    for attr in _Series.__slots__:
        value = getattr(s, attr)
        if isinstance(value, dict):
            value = dict(value)
        elif isinstance(value, _Histogram):
            value = _copy(value)
        setattr(c, attr, value)
    c.window = c.cache_windows = None  # the snapshot reads the windows through views (under the caller's lock)
    c.view = s.window.view() if s.window is not None else None
    windows = s.cache_windows
    c.cache_views = (windows[0].view(), windows[1].view()) if windows is not None else None
    return c


def _copy(h: _Histogram) -> _Histogram:
    c = _Histogram(h.bounds)
    c.buckets, c.sum, c.count = list(h.buckets), h.sum, h.count
    return c


def _family(name: str, doc: str, kind: str, values: Any) -> Metric:
    m = Metric(name, doc, kind)
    for (model, version), value in values:
        m.add_sample(name, {"model": model, "version": version}, value)
    return m


def _histogram(name: str, doc: str, values: Any) -> Metric:
    m = Metric(name, doc, "histogram")
    for (model, version), h in values:
        _add_histogram(m, {"model": model, "version": version}, h)
    return m


def _add_histogram(m: Metric, labels: dict[str, str], h: _Histogram, le_format: Any = None) -> None:
    """``le_format``: how bounds are written (default ``100.0``; Triton's families ``format_number``: ``100``)."""
    cumulative = 0
    for bound, n in zip((*h.bounds, float("inf")), h.buckets, strict=True):
        cumulative += n
        if bound == float("inf"):
            le = "+Inf"
        else:
            le = le_format(bound) if le_format is not None else str(float(bound))
        m.add_sample(f"{m.name}_bucket", {**labels, "le": le}, cumulative)
    m.add_sample(f"{m.name}_count", labels, h.count)
    m.add_sample(f"{m.name}_sum", labels, h.sum)


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text format 0.0.4, with counter names exactly as their samples are named.

    prometheus-client's ``generate_latest`` announces every counter as ``<name>_total``; Triton's counters
    have no such suffix, so the TYPE line follows the sample names instead. ``_created`` samples are left out.
    """
    out: list[str] = []
    for metric in registry.collect():
        samples = [s for s in metric.samples if not s.name.endswith("_created")]
        name = metric.name
        kind = metric.type if metric.type in ("counter", "gauge", "histogram", "summary") else "untyped"
        if kind == "counter" and samples and all(s.name == name + "_total" for s in samples):
            name += "_total"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for s in samples:
            if s.labels:
                labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items(), key=_label_order))
                out.append(f"{s.name}{{{labels}}} {floatToGoString(s.value)}\n")
            else:
                out.append(f"{s.name} {floatToGoString(s.value)}\n")
    return "".join(out).encode()


def _label_order(item: tuple[str, str]) -> tuple[bool, str]:
    """Labels sorted by name, ``le`` and ``quantile`` last (prometheus-cpp's order, so Triton's exact lines)."""
    return item[0] in ("le", "quantile"), item[0]


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
