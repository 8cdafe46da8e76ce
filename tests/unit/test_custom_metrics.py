"""The custom metric store behind pb_utils.MetricFamily: Triton's rules and texts."""

from __future__ import annotations

import pytest
from kubeinfer.server.vocabulary.custom_metrics import COUNTER, GAUGE, HISTOGRAM, CustomMetrics, MetricError


def test_counter_gauge_histogram() -> None:
    store = CustomMetrics()
    counter = store.family("hits", "hits", COUNTER, "m/1")
    c = store.metric(counter, {"model": "m"}, None)
    store.increment(counter, c, 2)
    with pytest.raises(MetricError, match="TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically"):
        store.increment(counter, c, -1)
    with pytest.raises(MetricError, match="TRITONSERVER_METRIC_KIND_COUNTER does not support Set"):
        store.set(counter, c, 1)
    gauge = store.family("level", "level", GAUGE, "m/1")
    g = store.metric(gauge, {}, None)
    store.set(gauge, g, 3.5)
    store.increment(gauge, g, -1)
    assert store.value(gauge, g) == 2.5
    hist = store.family("sizes", "sizes", HISTOGRAM, "m/1")
    with pytest.raises(MetricError, match="Missing required buckets"):
        store.metric(hist, {}, None)
    h = store.metric(hist, {"x": "y"}, [0.5, 1.0, 5.0])
    for v in (0.7, 3.0):
        store.observe(hist, h, v)
    families = {name: samples for name, _, _, samples in store.snapshot()}
    samples = {(name, labels.get("le", "")): value for name, labels, value in families["sizes"]}
    assert samples[("sizes_bucket", "0.5")] == 0
    assert samples[("sizes_bucket", "1")] == 1
    assert samples[("sizes_bucket", "5")] == 2
    assert samples[("sizes_bucket", "+Inf")] == 2
    assert samples[("sizes_count", "")] == 2 and samples[("sizes_sum", "")] == 3.7


def test_names_kinds_and_labels_are_checked() -> None:
    store = CustomMetrics()
    with pytest.raises(MetricError, match="Invalid metric name"):
        store.family("bad name", "", GAUGE, "o")
    store.family("same", "", GAUGE, "o")
    with pytest.raises(MetricError, match="Family name already exists with different type"):
        store.family("same", "", COUNTER, "o")
    family = store.family("same", "other description", GAUGE, "o")  # same name and kind: the same family
    with pytest.raises(MetricError, match="attempt to access JSON non-string as string"):
        store.metric(family, {"a": 1}, None)
    with pytest.raises(MetricError, match="Unexpected buckets found"):
        store.metric(family, {}, [1.0])


def test_families_leave_with_their_last_handle_or_their_model() -> None:
    store = CustomMetrics()
    a = store.family("f", "", GAUGE, "model-a")
    store.family("f", "", GAUGE, "model-b")  # a reload: the new version joins the family
    store.remove_owner("model-a")
    assert [n for n, *_ in store.snapshot()] == ["f"]
    store.release_family(a, "model-a")  # a late handle release of the unloaded version changes nothing
    assert [n for n, *_ in store.snapshot()] == ["f"]
    store.remove_owner("model-b")
    assert store.snapshot() == []
    m = store.metric(a, {}, None)
    with pytest.raises(MetricError, match="has been deleted"):
        store.set(a, m, 1)
