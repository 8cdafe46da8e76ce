"""``--metrics-config`` parsing as Triton parses it, and the summaries' window quantiles (exact, then sampled)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from kubeinfer.server.cli import build_parser, compat_notices, settings_from_args
from kubeinfer.server.observability import latencies
from kubeinfer.server.observability.latencies import (
    DEFAULT_QUANTILES,
    SAMPLE_CAP,
    AgeBucket,
    MetricsConfig,
    SummaryWindow,
    WindowView,
    format_number,
    parse_metrics_config,
    parse_quantiles,
    window_quantiles,
)


def test_defaults_are_tritons() -> None:
    assert parse_metrics_config([]) == MetricsConfig(True, False, False, DEFAULT_QUANTILES)
    assert [q for q, _ in DEFAULT_QUANTILES] == [0.5, 0.9, 0.95, 0.99, 0.999]
    assert latencies.FIRST_RESPONSE_BUCKETS_MS == (100, 500, 2000, 5000)
    assert (latencies.MAX_AGE_NS, latencies.AGE_BUCKETS) == (60 * 10**9, 5)  # prometheus-cpp's Summary


def test_settings_read_as_triton_reads_them() -> None:
    config = parse_metrics_config(["summary_latencies=true", "histogram_latencies=true", "counter_latencies=false"])
    assert (config.summary_latencies, config.histogram_latencies, config.counter_latencies) == (True, True, False)
    # exact strings; a setting only ever moves away from its default (Triton's ParseConfig loop)
    assert not parse_metrics_config(["summary_latencies=1"]).summary_latencies
    assert parse_metrics_config(["summary_latencies=true", "summary_latencies=false"]).summary_latencies
    assert parse_metrics_config(["counter_latencies=0"]).counter_latencies
    assert parse_metrics_config(["no_such_setting=true"]) == MetricsConfig()


@pytest.mark.parametrize("item", ["summary_latencies", "group,summary_latencies=true"])
def test_malformed_items_are_refused(item: str) -> None:
    with pytest.raises(ValueError, match="format is <setting>=<value>"):
        parse_metrics_config([item])


def test_quantiles_parse_as_tritons_parse_quantiles() -> None:
    assert parse_quantiles("0.5:0.05,0.9:0.01") == ((0.5, 0.05), (0.9, 0.01))
    assert parse_quantiles("0.1:0.0.1,0.7:0.01") == ((0.1, 0.0), (0.7, 0.01))  # std::stod reads a prefix
    assert parse_quantiles("0.5,x:1,0.9:0.01,1.5:0.1") == ((0.9, 0.01),)  # bad pairs are skipped
    # nothing parses: the defaults stay
    assert parse_metrics_config(["summary_quantiles=bad"]).quantiles == DEFAULT_QUANTILES
    assert parse_metrics_config(["summary_quantiles=0.2:0.01"]).quantiles == ((0.2, 0.01),)


def test_label_values_are_written_as_prometheus_cpp_writes_them() -> None:
    assert [format_number(v) for v in (100.0, 2.5, -1.0, 0.0, 0.999, math.inf)] == [
        "100",
        "2.5",
        "-1",
        "0",
        "0.999",
        "+Inf",
    ]


def test_the_flag_reaches_the_settings_and_is_no_longer_ignored(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["--model-repository", str(tmp_path), "--metrics-config", "summary_latencies=true", "--metrics-config=a=b"]
    )
    assert not any("--metrics-config" in w for w in compat_notices(args)[0])
    assert settings_from_args(args, triton=False).metrics_config.summary_latencies


def _view(*ages: AgeBucket) -> WindowView:
    return WindowView([(a, a.seen, a.rows) for a in ages], current_epoch=-1)


def _bucket(epoch: int, values: list[float], seen: int | None = None) -> AgeBucket:
    age = AgeBucket(epoch)
    age.rows = [(v, v, v, v, v) for v in values]
    age.seen = len(values) if seen is None else seen
    return age


def test_quantiles_are_exact_nearest_ranks_and_nan_when_empty() -> None:
    qs = [0.0, 0.5, 0.9, 0.99, 0.999, 1.0]
    out, _ = window_quantiles(_view(_bucket(1, [float(v) for v in range(1000, 0, -1)])), qs)
    assert out[0] == [1.0, 500.0, 900.0, 990.0, 999.0, 1000.0]
    empty, _ = window_quantiles(_view(), [0.5])
    assert math.isnan(empty[0][0])


def test_compute_families_skip_requests_that_did_not_execute() -> None:
    age = _bucket(1, [1.0, 2.0, 3.0])
    age.rows.append((100.0, 0.0, math.nan, math.nan, math.nan))  # type: ignore[union-attr]  # a cache hit
    age.seen = 4
    out, _ = window_quantiles(_view(age), [1.0])
    assert out[0] == [100.0] and out[3] == [3.0]


def test_a_sampled_bucket_weighs_each_kept_row_for_the_rows_it_stands_for() -> None:
    # 100 kept rows standing for 10,000 requests at 1.0; 100 requests at 2.0 in another bucket
    sampled, exact = _bucket(1, [1.0] * 100, seen=10_000), _bucket(2, [2.0] * 100)
    out, compacted = window_quantiles(_view(sampled, exact), [0.5, 0.98, 0.995])
    assert out[0] == [1.0, 1.0, 2.0]
    assert len(compacted) == 2  # past buckets are compacted into arrays under the lock afterwards
    latencies.compact(compacted)
    assert not isinstance(sampled.rows, list)
    assert window_quantiles(_view(sampled, exact), [0.995])[0][0] == [2.0]


def test_observing_past_the_cap_keeps_a_bounded_uniform_sample() -> None:
    window = SummaryWindow()
    for i in range(SAMPLE_CAP * 3):
        window.observe((float(i), 0.0, 0.0, 0.0, 0.0))
    age = window.current
    assert age.seen == SAMPLE_CAP * 3 and len(age.rows) == SAMPLE_CAP
    (median,) = window_quantiles(window.view(), [0.5])[0][0]
    assert abs(median - SAMPLE_CAP * 1.5) < SAMPLE_CAP * 3 * 0.02  # a uniform sample's median
