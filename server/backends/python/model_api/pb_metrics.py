"""``pb_utils.MetricFamily`` and ``Metric``: custom metrics a model exports on ``/metrics``.

The API and its error texts are Triton 2.51's (pybind docstrings and messages read from a running
Triton): ``MetricFamily(name, description, kind)`` with ``kind`` one of ``MetricFamily.COUNTER``,
``GAUGE``, ``HISTOGRAM``; ``family.Metric(labels=None, buckets=None)`` (buckets for histograms only);
``metric.increment(v)``, ``set(v)``, ``observe(v)``, ``value()``. Refusals raise
``TritonModelException``. The store behind them is the server's (``vocabulary.custom_metrics``), reached
through the host; a family leaves ``/metrics`` when its last Python handle is gone or its model unloads.

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import enum
from typing import Any

from . import context
from .pb_types import TritonModelException


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _fail(prefix: str, exc: context.MetricRefused) -> TritonModelException:
    if exc.core:  # refused by the metrics registry: Triton names the model instance
        instance = context.current()
        name = instance.instance_name if instance is not None else ""
        return TritonModelException(f"{prefix}Failed to process the request for model '{name}', message: {exc}")
    return TritonModelException(f"{prefix}{exc}")


def _host() -> context.Host:
    host = context.host()
    if host is None:
        raise TritonModelException("custom metrics are only available inside a model served by kubeinfer")
    return host


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        instance = context.current()
        self._owner = instance.metrics_owner if instance is not None else ""
        self._family: Any = None
        self._host = _host()
        try:
            kind_value = MetricKind(int(kind))
        except (ValueError, TypeError):
            raise TritonModelException(f"Error when creating MetricFamily: unknown metric kind {kind!r}") from None
        try:
            self._family = self._host.metric_family(name, description, int(kind_value), self._owner)
        except context.MetricRefused as exc:
            raise _fail("Error when creating MetricFamily: ", exc) from None

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        assert self._family is not None
        try:
            metric = self._host.metric(self._family, labels, buckets)
        except context.MetricRefused as exc:
            raise _fail("Error when creating Metric: " if exc.core else "", exc) from None
        return Metric(self._host, self._family, metric)

    def __del__(self) -> None:
        if getattr(self, "_family", None) is not None:
            self._host.release_family(self._family, self._owner)


class Metric:
    def __init__(self, host: context.Host, family: Any, metric: Any) -> None:
        self._host = host
        self._family = family
        self._metric = metric

    def increment(self, value: float) -> None:
        self._call("Failed to increment metric value: ", "increment", value)

    def set(self, value: float) -> None:
        self._call("Failed to set metric value: ", "set", value)

    def observe(self, value: float) -> None:
        self._call("Failed to observe metric value: ", "observe", value)

    def value(self) -> float:
        return float(self._call("Failed to get metric value: ", "value", None) or 0.0)

    def _call(self, prefix: str, op: str, value: float | None) -> float | None:
        try:
            return self._host.metric_op(op, self._family, self._metric, None if value is None else float(value))
        except context.MetricRefused as exc:
            raise _fail(prefix, exc) from None

    def __del__(self) -> None:
        if getattr(self, "_metric", None) is not None:
            self._host.release_metric(self._family, self._metric)
