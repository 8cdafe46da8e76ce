"""Metric families that models create (``pb_utils.MetricFamily``), exported on ``/metrics`` beside ours.

Semantics and error texts are Triton's custom metrics (core src/metric_family.cc, python_backend
src/metric_family.cc, checked against Triton 2.51): a family is a name, a description and a kind
(counter, gauge, histogram); a metric is one label set of a family. Counters only grow, gauges are set
or incremented by any amount, histograms observe into fixed buckets. Creating a family twice with the
same name returns the same series (a different kind is refused); a family disappears when the last
handle to it is released or when the model that made it unloads.

Updated from model threads and read at scrape time, so every operation takes the store's lock.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
_KIND_NAME = {COUNTER: "COUNTER", GAUGE: "GAUGE", HISTOGRAM: "HISTOGRAM"}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MetricError(ValueError):
    """A refused metric operation; the message is Triton's. ``core``: Triton's server core refuses it
    (the Python API then names the model instance), else the Python API itself does."""

    def __init__(self, message: str, core: bool = True) -> None:
        super().__init__(message)
        self.core = core


@dataclass
class CustomMetric:
    labels: dict[str, str]
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    #: histogram only: per-bucket counts (not cumulative), then sum and count
    bucket_counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0
    handles: int = 0


@dataclass
class CustomFamily:
    name: str
    description: str
    kind: str
    metrics: dict[tuple[tuple[str, str], ...], CustomMetric] = field(default_factory=dict)
    #: live handles per owner (a model version load): the family lives while any owner holds one
    owners: dict[str, int] = field(default_factory=dict)
    removed: bool = False


class CustomMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, CustomFamily] = {}

    # ---- families ---------------------------------------------------------------------------
    def family(self, name: str, description: str, kind: str, owner: str) -> CustomFamily:
        """Create (or join) family ``name``; one handle more."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise MetricError("Invalid metric name")
        with self._lock:
            family = self._families.get(name)
            if family is not None and family.kind != kind:
                raise MetricError("Family name already exists with different type")
            if family is None:
                family = self._families[name] = CustomFamily(name, description, kind)
            family.owners[owner] = family.owners.get(owner, 0) + 1
            return family

    def release_family(self, family: CustomFamily, owner: str) -> None:
        """One handle fewer; the family leaves ``/metrics`` with its last handle."""
        with self._lock:
            if owner not in family.owners:
                return  # its model unloaded already
            family.owners[owner] -= 1
            if family.owners[owner] <= 0:
                del family.owners[owner]
            if not family.owners:
                self._drop(family)

    def remove_owner(self, owner: str) -> None:
        """A model unloads: its handles go, and with them every family no other model holds."""
        with self._lock:
            for family in list(self._families.values()):
                if family.owners.pop(owner, None) is not None and not family.owners:
                    self._drop(family)

    def _drop(self, family: CustomFamily) -> None:
        family.removed = True
        if self._families.get(family.name) is family:
            del self._families[family.name]

    # ---- metrics ----------------------------------------------------------------------------
    def metric(self, family: CustomFamily, labels: object, buckets: object) -> CustomMetric:
        if labels is None:
            labels = {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise MetricError("attempt to access JSON non-string as string")
        if not all(isinstance(k, str) and _LABEL.match(k) for k in labels):
            raise MetricError("Invalid label name")
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("Failed to create metric. Missing required buckets.", core=False)
            bounds = tuple(float(b) for b in buckets)  # type: ignore[attr-defined]
            if list(bounds) != sorted(bounds):
                raise MetricError("Histogram buckets must be in increasing order")
        elif buckets is not None:
            raise MetricError("Failed to create metric. Unexpected buckets found.", core=False)
        else:
            bounds = ()
        key = tuple(sorted(labels.items()))
        with self._lock:
            metric = family.metrics.get(key)
            if metric is None:
                metric = family.metrics[key] = CustomMetric(dict(labels), bounds, bucket_counts=[0] * (len(bounds) + 1))
            metric.handles += 1
            return metric

    def release_metric(self, family: CustomFamily, metric: CustomMetric) -> None:
        with self._lock:
            metric.handles -= 1
            if metric.handles <= 0:
                family.metrics = {k: m for k, m in family.metrics.items() if m is not metric}

    def increment(self, family: CustomFamily, metric: CustomMetric, value: float) -> None:
        with self._lock:
            _alive(family)
            if family.kind == HISTOGRAM:
                raise MetricError(f"{_kind(family)} does not support Increment")
            if family.kind == COUNTER and value < 0:
                raise MetricError(f"{_kind(family)} can only be incremented monotonically by non-negative values.")
            metric.value += value

    def set(self, family: CustomFamily, metric: CustomMetric, value: float) -> None:
        with self._lock:
            _alive(family)
            if family.kind != GAUGE:
                raise MetricError(f"{_kind(family)} does not support Set")
            metric.value = value

    def observe(self, family: CustomFamily, metric: CustomMetric, value: float) -> None:
        with self._lock:
            _alive(family)
            if family.kind != HISTOGRAM:
                raise MetricError(f"{_kind(family)} does not support Observe")
            index = next((i for i, b in enumerate(metric.buckets) if value <= b), len(metric.buckets))
            metric.bucket_counts[index] += 1
            metric.sum += value
            metric.count += 1

    def value(self, family: CustomFamily, metric: CustomMetric) -> float:
        with self._lock:
            _alive(family)
            if family.kind == HISTOGRAM:
                raise MetricError(f"{_kind(family)} does not support Value")
            return metric.value

    # ---- scrape -----------------------------------------------------------------------------
    def snapshot(self) -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """(name, description, kind, samples) per family, samples named as Prometheus writes them."""
        out = []
        with self._lock:
            for family in sorted(self._families.values(), key=lambda f: f.name):
                samples: list[tuple[str, dict[str, str], float]] = []
                for metric in family.metrics.values():
                    if family.kind != HISTOGRAM:
                        samples.append((family.name, dict(metric.labels), metric.value))
                        continue
                    cumulative = 0
                    for bound, n in zip((*metric.buckets, math.inf), metric.bucket_counts, strict=True):
                        cumulative += n
                        le = "+Inf" if bound == math.inf else _bound(bound)
                        samples.append((f"{family.name}_bucket", {**metric.labels, "le": le}, cumulative))
                    samples.append((f"{family.name}_count", dict(metric.labels), metric.count))
                    samples.append((f"{family.name}_sum", dict(metric.labels), metric.sum))
                out.append((family.name, family.description, family.kind, samples))
        return out


def _alive(family: CustomFamily) -> None:
    if family.removed:
        raise MetricError(
            "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
            "object should be deleted AFTER its corresponding 'Metric' objects have been deleted.",
            core=False,
        )


def _kind(family: CustomFamily) -> str:
    return f"TRITONSERVER_METRIC_KIND_{_KIND_NAME[family.kind]}"


def _bound(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)
