"""``pb_utils.MetricFamily`` and ``Metric``: custom metrics a model exports on ``/metrics``.

The API and its error texts are Triton 2.51's (pybind docstrings and messages read from a running
Triton): ``MetricFamily(name, description, kind)`` with ``kind`` one of ``MetricFamily.COUNTER``,
``GAUGE``, ``HISTOGRAM``; ``family.Metric(labels=None, buckets=None)`` (buckets for histograms only);
``metric.increment(v)``, ``set(v)``, ``observe(v)``, ``value()``. Refusals raise
``TritonModelException``. The store behind them is the server's ``CustomMetrics``; a family leaves
``/metrics`` when its last Python handle is gone or its model unloads.
"""

from __future__ import annotations

import enum
from typing import Any

from ...vocabulary import custom_metrics as store
from . import context
from .pb_types import TritonModelException


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KINDS = {MetricKind.COUNTER: store.COUNTER, MetricKind.GAUGE: store.GAUGE, MetricKind.HISTOGRAM: store.HISTOGRAM}


def _fail(prefix: str, exc: store.MetricError) -> TritonModelException:
    if exc.core:  # refused by the metrics registry: Triton names the model instance
        instance = context.current()
        name = instance.instance_name if instance is not None else ""
        return TritonModelException(f"{prefix}Failed to process the request for model '{name}', message: {exc}")
    return TritonModelException(f"{prefix}{exc}")


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        instance = context.current()
        owner = instance.metrics_owner if instance is not None else ""
        self._store = context.server.custom_metrics
        self._owner = owner
        self._family: store.CustomFamily | None = None
        try:
            kind_name = _KINDS[MetricKind(int(kind))]
        except (ValueError, KeyError):
            raise TritonModelException(f"Error when creating MetricFamily: unknown metric kind {kind!r}") from None
        try:
            self._family = self._store.family(name, description, kind_name, owner)
        except store.MetricError as exc:
            raise _fail("Error when creating MetricFamily: ", exc) from None

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        assert self._family is not None
        try:
            metric = self._store.metric(self._family, labels, buckets)
        except store.MetricError as exc:
            raise _fail("Error when creating Metric: " if exc.core else "", exc) from None
        return Metric(self._store, self._family, metric)

    def __del__(self) -> None:
        if getattr(self, "_family", None) is not None:
            self._store.release_family(self._family, self._owner)  # type: ignore[arg-type]


class Metric:
    def __init__(self, metrics: store.CustomMetrics, family: store.CustomFamily, metric: store.CustomMetric) -> None:
        self._store = metrics
        self._family = family
        self._metric = metric

    def increment(self, value: float) -> None:
        self._call("Failed to increment metric value: ", self._store.increment, value)

    def set(self, value: float) -> None:
        self._call("Failed to set metric value: ", self._store.set, value)

    def observe(self, value: float) -> None:
        self._call("Failed to observe metric value: ", self._store.observe, value)

    def value(self) -> float:
        return float(self._call("Failed to get metric value: ", self._store.value))

    def _call(self, prefix: str, op: Any, *args: float) -> Any:
        try:
            return op(self._family, self._metric, *(float(a) for a in args))
        except store.MetricError as exc:
            raise _fail(prefix, exc) from None

    def __del__(self) -> None:
        if getattr(self, "_metric", None) is not None:
            self._store.release_metric(self._family, self._metric)
