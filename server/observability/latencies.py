"""Triton's opt-in latency families and the ``--metrics-config`` settings that choose them.

``--metrics-config <setting>=<value>`` (repeatable), read as Triton reads it (core
``src/metric_model_reporter.cc``, ``MetricReporterConfig::ParseConfig``; the server's
``command_line_parser.cc``, ``ParseMetricsConfigOption``):

* ``counter_latencies=false``: no ``nv_inference_{request,queue,compute_*}_duration_us`` counters (nor the
  per-model cache counters, which Triton creates with them). Only the literal ``false`` turns them off.
* ``summary_latencies=true``: summaries ``nv_inference_{request,queue,compute_input,compute_infer,
  compute_output}_summary_us`` per version, over successful requests (``src/infer_stats.cc``), ``_count`` and
  ``_sum`` since start and quantiles over the last 60 s (prometheus-cpp's ``Summary`` defaults, which Triton
  keeps: max age 60 s in 5 age buckets). The request summary is left out for versions with the response
  cache on (Triton's DLIS-4762). Only the literal ``true`` turns them on. With them, for versions with the response
  cache on, ``nv_cache_hit_summary_per_model`` and ``nv_cache_miss_summary_per_model``: the cache lookup time of
  each hit, and the lookup plus insertion time of each miss, µs (core ``src/infer_stats.cc``,
  ``UpdateSuccessCacheHit`` / ``UpdateSuccessCacheMiss``; same quantiles and window).
* ``summary_quantiles=<q>:<error>,...``: the quantiles (default Triton's ``0.5:0.05, 0.9:0.01, 0.95:0.001,
  0.99:0.001, 0.999:0.001``); a pair that does not parse is logged and skipped, none parsing keeps the default.
* ``histogram_latencies=true``: ``nv_inference_first_response_histogram_ms`` per version: whole milliseconds
  from the request's arrival to its first response, error responses included, a flag-only final not
  (``src/infer_response.cc``, ``UpdateResponseMetrics``); for every model, as Triton since it dropped the
  decoupled-only restriction. Buckets ``100, 500, 2000, 5000`` ms, or a model's own through config.pbtxt
  ``model_metrics { metric_control { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
  histogram_options { buckets: [...] } } }``.

A ``<setting>`` with a comma, or an item without ``=``, is refused at start as Triton refuses it; a setting
Triton does not know is ignored (with a warning here).

How quantiles are computed: prometheus-client's ``Summary`` exports only ``_count`` and ``_sum``, and a
streaming estimator in Python (CKMS as prometheus-cpp runs it, or a t-digest/DDSketch package) costs
microseconds per observation and family on the request path. Instead each version keeps the observations of
the window itself, per age bucket of 12 s: one tuple per successful request appended to a list (the cheapest
record Python has, under the lock the record already takes), sorted with numpy only when scraped, outside the
lock. Quantiles are then exact (rank error 0, inside any configured tolerance) while an age bucket holds at most
``SAMPLE_CAP`` requests (about 680 requests/s per version); beyond that the bucket keeps a uniform sample
(reservoir sampling; each kept row is weighted by how many it stands for), whose rank error is about
``sqrt(q(1-q)/40960)``: 5e-4 at p99, 1.6e-4 at p99.9. Memory is bounded: ``SAMPLE_CAP`` rows per age bucket,
about 1.7 MB for the current one and 0.3 MB for each past one, which the next scrape compacts into an array.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from random import random
from typing import Any

import numpy as np

log = logging.getLogger("kubeinfer.server")

FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"
#: Triton's default first-response buckets, ms (``MetricReporterConfig::histogram_options_``)
FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)
#: Triton's default (quantile, error) pairs (``MetricReporterConfig::quantiles_``)
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
#: prometheus-cpp ``Summary`` defaults, which Triton does not change: quantiles over the last 60 s, in 5 parts
MAX_AGE_NS = 60 * 1_000_000_000
AGE_BUCKETS = 5
ROTATION_NS = MAX_AGE_NS // AGE_BUCKETS
#: observations one age bucket keeps per family before it samples
SAMPLE_CAP = 8192
#: values per observation row of the request summaries: one per summary family
ROW = 5

#: (name, help) of the summary families in the order of an ``AgeBucket``'s row; Triton's help strings
SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)
#: (name, help) of the per-model response-cache summaries, hit then miss (one value per row); Triton's help strings
CACHE_SUMMARIES = (
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds."),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds."),
)
FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"


@dataclass(frozen=True)
class MetricsConfig:
    """Which latency families the metrics endpoint carries (``--metrics-config``)."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES


def parse_metrics_config(items: Sequence[str]) -> MetricsConfig:
    """``--metrics-config`` items, in order; raises ValueError where Triton stops with a parse error."""
    counters, summaries, histograms, quantiles = True, False, False, DEFAULT_QUANTILES
    for item in items:
        setting, sep, value = item.partition("=")
        if not sep or "," in setting:
            raise ValueError(f"--metrics-config option format is <setting>=<value>. Got {item}")
        # Triton compares the exact strings, and each setting only ever moves away from its default
        if setting == "counter_latencies":
            counters = counters and value != "false"
        elif setting == "summary_latencies":
            summaries = summaries or value == "true"
        elif setting == "histogram_latencies":
            histograms = histograms or value == "true"
        elif setting == "summary_quantiles":
            quantiles = parse_quantiles(value) or quantiles
        else:
            log.warning("--metrics-config %s: unknown setting, ignored (as Triton ignores it)", item)
            continue
        if setting != "summary_quantiles" and value not in ("true", "false"):
            log.warning("--metrics-config %s: only 'true' and 'false' are read (as Triton reads them)", item)
    return MetricsConfig(counters, summaries, histograms, quantiles)


_NUMBER = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """``"<q>:<error>,..."`` → pairs. Triton's ``ParseQuantiles``: a pair without ``:`` or whose numbers do not
    parse is logged and skipped; each number is read as ``std::stod`` reads it (its longest numeric prefix).
    A quantile outside [0, 1] is skipped too (prometheus-cpp would compute nonsense for it)."""
    pairs: list[tuple[float, float]] = []
    for part in text.split(","):
        q_text, sep, e_text = part.partition(":")
        if not sep:
            log.error("Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", part)
            continue
        q, e = _stod(q_text), _stod(e_text)
        if q is None or e is None:
            log.error("Invalid option: [%s]. Error: stod", part)
            continue
        if not 0.0 <= q <= 1.0:
            log.error("Invalid option: [%s]. A quantile is between 0 and 1", part)
            continue
        pairs.append((q, e))
    return tuple(pairs)


def _stod(text: str) -> float | None:
    m = _NUMBER.match(text)
    return float(m.group()) if m else None


def format_number(value: float) -> str:
    """A label value as prometheus-cpp writes it (shortest round trip, no trailing ``.0``): ``100``, ``2.5``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def first_response_buckets(config: Any, histograms: bool) -> tuple[float, ...] | None:
    """A model's own first-response buckets (config.pbtxt ``model_metrics``), or None for Triton's defaults.

    A family Triton cannot customise is warned about, as Triton does. With ``histograms`` on, buckets that are
    not strictly increasing refuse the load (prometheus-cpp throws on them when Triton creates the histogram).
    """
    buckets: tuple[float, ...] | None = None
    for control in config.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family != FIRST_RESPONSE_FAMILY:
            log.warning(
                "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.", family
            )
            continue
        buckets = tuple(float(b) for b in control.histogram_options.buckets)
    if buckets is not None and histograms and any(a >= b for a, b in zip(buckets, buckets[1:], strict=False)):
        raise ValueError(
            f"model '{config.name}': model_metrics buckets for {FIRST_RESPONSE_FAMILY} must be strictly increasing,"
            f" got {list(buckets)}"
        )
    return buckets


#: one observation: a value per family of its window (``ROW`` for the request summaries, 1 for a cache summary)
Row = tuple[float, ...]


class AgeBucket:
    """One age bucket's observations: rows of (request, queue, compute input, infer, output) µs, the
    ``SUMMARIES`` order (NaN compute for a request that did not execute: a cache hit), or of one cache lookup's
    µs in a cache summary's window; ``seen`` rows observed,
    at most ``SAMPLE_CAP`` kept. The current bucket appends tuples (the cheapest record); a past one is
    compacted into an array by the first scrape that reads it."""

    __slots__ = ("epoch", "seen", "rows")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.seen = 0
        self.rows: list[Row] | np.ndarray = []


@dataclass
class WindowView:
    """What a scrape reads of a window: per live age bucket (epoch, rows seen, rows kept), taken under the
    metrics' lock (the current bucket's list copied, past ones by reference: nobody writes them); ``width``
    values per row."""

    ages: list[tuple[AgeBucket, int, list[Row] | np.ndarray]]
    current_epoch: int
    width: int = ROW


class SummaryWindow:
    """The last ``MAX_AGE_NS`` of one version's observations, in ``AGE_BUCKETS`` age buckets: the window
    prometheus-cpp's summary answers from (48 to 60 s of observations). ``width`` values per row: one per
    summary family the window feeds (``ROW`` for the request summaries, 1 for a cache summary)."""

    __slots__ = ("ages", "current", "width")

    def __init__(self, width: int = ROW) -> None:
        self.width = width
        self.current = AgeBucket(-1)
        self.ages: deque[AgeBucket] = deque(maxlen=AGE_BUCKETS)

    def observe(self, row: Row) -> None:
        """One successful request's row (on the request path, under the metrics' lock: one list append)."""
        age = self.current
        epoch = time.monotonic_ns() // ROTATION_NS
        if age.epoch != epoch:
            age = self.current = AgeBucket(epoch)
            self.ages.append(age)  # the oldest falls out
        n = age.seen
        age.seen = n + 1
        if n < SAMPLE_CAP:
            age.rows.append(row)  # type: ignore[union-attr]  # the current bucket's rows are a list
        else:  # reservoir sampling: every row of the bucket is kept with the same probability
            j = int(random() * (n + 1))
            if j < SAMPLE_CAP:
                age.rows[j] = row

    def view(self) -> WindowView:
        """Under the caller's lock: the live age buckets."""
        epoch = time.monotonic_ns() // ROTATION_NS
        ages = []
        for age in self.ages:
            if age.epoch > epoch - AGE_BUCKETS:
                rows = age.rows
                ages.append((age, age.seen, list(rows) if age is self.current else rows))
        return WindowView(ages, self.current.epoch, self.width)


def window_quantiles(view: WindowView, qs: Sequence[float]) -> tuple[list[list[float]], list[tuple[Any, Any]]]:
    """Outside the lock: per summary family the ``qs`` quantiles over the window (NaN when it holds no
    observation, as prometheus-cpp answers), and (past bucket, its rows as an array) to compact under the
    lock (``compact``). Each kept row stands for ``seen / kept`` rows of its bucket (1 until it samples)."""
    tables: list[np.ndarray] = []
    weights: list[float] = []
    compacted: list[tuple[Any, Any]] = []
    for age, seen, rows in view.ages:
        table = rows if isinstance(rows, np.ndarray) else np.array(rows, dtype=np.float64).reshape(-1, view.width)
        if not isinstance(rows, np.ndarray) and age.epoch != view.current_epoch:
            compacted.append((age, (rows, table)))
        if len(table):
            tables.append(table)
            weights.append(seen / len(table))
    out = []
    for family in range(view.width):
        parts = [t[:, family] for t in tables]
        w = [np.full(len(t), wt) for t, wt in zip(tables, weights, strict=True)]
        v = np.concatenate(parts) if parts else np.empty(0)
        wv = np.concatenate(w) if w else np.empty(0)
        keep = ~np.isnan(v)
        out.append(_quantiles(v[keep], wv[keep], qs))
    return out, compacted


def compact(compacted: list[tuple[Any, Any]]) -> None:
    """Under the caller's lock: past buckets keep their rows as arrays (40 bytes a row, not ~200)."""
    for age, (rows, table) in compacted:
        if age.rows is rows:
            age.rows = table


def _quantiles(v: np.ndarray, w: np.ndarray, qs: Sequence[float]) -> list[float]:
    if not len(v):
        return [math.nan] * len(qs)
    order = np.argsort(v, kind="stable")
    v = v[order]
    cumulative = np.cumsum(w[order])
    total = cumulative[-1]
    out = []
    for q in qs:
        # the smallest value with at least q of the observations at or below it (nearest rank)
        i = int(np.searchsorted(cumulative, q * total - 1e-9 * total, side="left"))
        out.append(float(v[min(i, len(v) - 1)]))
    return out
