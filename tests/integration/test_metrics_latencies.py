"""Triton's opt-in latency families (``--metrics-config``): summaries and the first-response histogram.

Names, help, types, label sets, default quantiles and buckets are Triton's (core ``src/metrics.cc``,
``src/metric_model_reporter.{h,cc}``, ``src/infer_stats.cc``, ``src/infer_response.cc``; the server's
``qa/L0_metrics`` tests read the same lines). Every count and sum is checked against the statistics API, the
other view of the same records. Real server processes, real tritonclient requests, ``/metrics`` over httpx.
"""

from __future__ import annotations

import math
import queue
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.repos import copy_python_models
from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import require_sleep_backend, stats, write_sleep_model
from tests.support.waiting import wait_for

SUMMARIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)
CACHE_SUMMARIES = ("nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model")
FIRST = "nv_inference_first_response_histogram_ms"
TRITON_QUANTILES = ["0.5", "0.9", "0.95", "0.99", "0.999"]
TRITON_BUCKETS = ["100", "500", "2000", "5000", "+Inf"]
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
OWN_BUCKETS = """
model_metrics {
  metric_control: [
    {
      metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
      histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] }
    }
  ]
}
"""


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str, python: bool = False) -> ServerProcess:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp(name) / "repo"
    write_sleep_model(repo, "summarised", 0)
    write_sleep_model(repo, "hist", 0)
    write_sleep_model(repo, "own_buckets", 0, OWN_BUCKETS)
    write_sleep_model(repo, "cached", 0, "response_cache { enable: true }\n")
    write_sleep_model(repo, "cache_summarised", 0, "response_cache { enable: true }\n")
    if python:
        copy_python_models(repo, "repeat_int32")
    return start_server(repo, "--cache-config", "local,size=1048576", *flags, log_dir=repo.parent)


@pytest.fixture(scope="module")
def latency_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _start(
        tmp_path_factory,
        "latencies",
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config=histogram_latencies=true",
        python=True,
    )
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _start(tmp_path_factory, "plain")
    yield srv
    srv.terminate()


def scrape(server: ServerProcess) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    text = httpx.get(server.metrics_url, timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"unparsable exposition line: {line!r}"
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
            samples[(m["name"], labels)] = float(m["value"])
    return text, samples


def series(samples: dict, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` carrying ``labels`` (and maybe more), keyed by all their labels."""
    want = set(labels.items())
    return {k: v for (n, k), v in samples.items() if n == name and want <= k}


def one(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def _input(values: np.ndarray, module: object = httpclient) -> object:
    inp = module.InferInput("INPUT0", list(values.shape), "FP32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(values)
    return inp


def test_summaries_are_tritons_with_counts_sums_and_quantiles_of_the_requests(latency_server: ServerProcess) -> None:
    sleeps_ms = list(range(1, 13))
    client = httpclient.InferenceServerClient(latency_server.http_url)
    slowest = 0.0
    for ms in sleeps_ms:
        start = time.monotonic()
        client.infer("summarised", [_input(np.ones((1, 2), np.float32))], parameters={"sleep_ms": ms})
        slowest = max(slowest, time.monotonic() - start)
    client.close()
    text, m = scrape(latency_server)
    s = stats(latency_server.base_url, "summarised")["inference_stats"]
    labels = {"model": "summarised", "version": "1"}

    for name in SUMMARIES:
        assert f"# TYPE {name} summary\n" in text
        quantiles = series(m, name, **labels)
        # exactly model, version and Triton's five quantiles, in prometheus-cpp's line format
        assert sorted(dict(k)["quantile"] for k in quantiles) == sorted(TRITON_QUANTILES)
        assert {frozenset(k - {("quantile", dict(k)["quantile"])}) for k in quantiles} == {frozenset(labels.items())}
        assert f'{name}{{model="summarised",version="1",quantile="0.5"}} ' in text
        assert one(m, f"{name}_count", **labels) == len(sleeps_ms)
        values = [one(m, name, quantile=q, **labels) for q in TRITON_QUANTILES]
        assert values == sorted(values), (name, values)
        assert 0 <= values[0] and values[-1] <= slowest * 1e6, (name, values)

    # the same records as the statistics API: sums are its totals, in µs
    for name, key in (
        ("nv_inference_request_summary_us", "success"),
        ("nv_inference_queue_summary_us", "queue"),
        ("nv_inference_compute_infer_summary_us", "compute_infer"),
    ):
        assert s[key]["count"] == len(sleeps_ms)
        assert one(m, f"{name}_sum", **labels) == pytest.approx(s[key]["ns"] / 1000, rel=1e-9)
    # every execution slept its request's sleep_ms: each compute_infer observation is at least that long, so
    # the median is at least the 6th smallest sleep and the top quantiles at least the longest (exact ranks)
    infer = {q: one(m, "nv_inference_compute_infer_summary_us", quantile=q, **labels) for q in TRITON_QUANTILES}
    assert infer["0.5"] >= 6_000
    assert infer["0.999"] >= 12_000
    assert infer["0.5"] <= infer["0.999"] <= slowest * 1e6


def test_request_summary_is_left_out_for_a_cached_model_as_triton_does(latency_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(latency_server.http_url)
    for _ in range(3):  # a miss, then two hits
        client.infer("cached", [_input(np.full((1, 2), 7, np.float32))])
    client.close()
    _, m = scrape(latency_server)
    labels = {"model": "cached", "version": "1"}
    assert not series(m, "nv_inference_request_summary_us_count", **labels)
    assert one(m, "nv_inference_queue_summary_us_count", **labels) == 3
    assert one(m, "nv_inference_compute_infer_summary_us_count", **labels) == 1  # hits do not execute


def test_cache_hit_and_miss_summaries_are_tritons_and_observe_each_lookup(latency_server: ServerProcess) -> None:
    labels = {"model": "cache_summarised", "version": "1"}
    text, m = scrape(latency_server)
    for name in CACHE_SUMMARIES:  # created with the version, as Triton creates them at load: 0 and no quantiles
        assert f"# TYPE {name} summary\n" in text
        assert one(m, f"{name}_count", **labels) == 0
        assert all(math.isnan(one(m, name, quantile=q, **labels)) for q in TRITON_QUANTILES)
    assert not series(m, "nv_cache_hit_summary_per_model", model="summarised")  # only versions with the cache

    client = httpclient.InferenceServerClient(latency_server.http_url)
    client.infer("cache_summarised", [_input(np.full((1, 2), 3, np.float32))])  # a miss
    _, m = scrape(latency_server)
    assert one(m, "nv_cache_miss_summary_per_model_count", **labels) == 1
    assert one(m, "nv_cache_hit_summary_per_model_count", **labels) == 0
    miss = [one(m, "nv_cache_miss_summary_per_model", quantile=q, **labels) for q in TRITON_QUANTILES]
    # one observation: every quantile is it, and it is the sum
    assert miss == [one(m, "nv_cache_miss_summary_per_model_sum", **labels)] * len(TRITON_QUANTILES)
    assert miss[0] > 0
    assert all(math.isnan(one(m, "nv_cache_hit_summary_per_model", quantile=q, **labels)) for q in TRITON_QUANTILES)

    for _ in range(2):  # two hits
        client.infer("cache_summarised", [_input(np.full((1, 2), 3, np.float32))])
    client.infer("cache_summarised", [_input(np.full((1, 2), 4, np.float32))])  # another miss
    client.close()
    text, m = scrape(latency_server)
    s = stats(latency_server.base_url, "cache_summarised")["inference_stats"]
    for name, key in (
        ("nv_cache_hit_summary_per_model", "cache_hit"),
        ("nv_cache_miss_summary_per_model", "cache_miss"),
    ):
        quantiles = series(m, name, **labels)
        assert sorted(dict(k)["quantile"] for k in quantiles) == sorted(TRITON_QUANTILES)
        assert {frozenset(k - {("quantile", dict(k)["quantile"])}) for k in quantiles} == {frozenset(labels.items())}
        assert f'{name}{{model="cache_summarised",version="1",quantile="0.5"}} ' in text
        # the same records as the statistics API and the per-model cache counters
        assert s[key]["count"] == 2
        assert one(m, f"{name}_count", **labels) == 2
        total = one(m, f"{name}_sum", **labels)
        assert total == pytest.approx(s[key]["ns"] / 1000, rel=1e-9)
        assert total == pytest.approx(one(m, name.replace("summary", "duration"), **labels), rel=1e-9)
        # two observations: the median is the smaller (nearest rank), the top quantiles the larger, and the two
        # are the sum
        low, high = one(m, name, quantile="0.5", **labels), one(m, name, quantile="0.999", **labels)
        assert 0 < low <= high
        assert low + high == pytest.approx(total, rel=1e-9)
        assert one(m, name, quantile="0.9", **labels) == high


def test_first_response_histogram_has_tritons_buckets_and_counts_every_request(latency_server: ServerProcess) -> None:
    n = 9
    client = grpcclient.InferenceServerClient(latency_server.grpc_url)
    for _ in range(n):
        client.infer("hist", [_input(np.ones((1, 2), np.float32), grpcclient)])
    client.close()
    text, m = scrape(latency_server)
    labels = {"model": "hist", "version": "1"}
    assert f"# TYPE {FIRST} histogram\n" in text
    buckets = series(m, f"{FIRST}_bucket", **labels)
    assert [dict(k)["le"] for k in buckets] == TRITON_BUCKETS
    for le in TRITON_BUCKETS:  # Triton's own QA reads these exact keys
        assert f'{FIRST}_bucket{{model="hist",version="1",le="{le}"}} ' in text
    assert one(m, f"{FIRST}_count", **labels) == n
    assert one(m, f"{FIRST}_bucket", le="+Inf", **labels) == n
    counts = list(buckets.values())
    assert counts == sorted(counts)
    s = stats(latency_server.base_url, "hist")["inference_stats"]["success"]
    # whole milliseconds, each at most its request's duration
    assert one(m, f"{FIRST}_sum", **labels) <= s["ns"] / 1e6
    assert one(m, f"{FIRST}_sum", **labels) == int(one(m, f"{FIRST}_sum", **labels))

    # a model's own buckets from config.pbtxt model_metrics (Triton's QA override: -1, 0, 1, 2.5)
    own = series(m, f"{FIRST}_bucket", model="own_buckets", version="1")
    assert [dict(k)["le"] for k in own] == ["-1", "0", "1", "2.5", "+Inf"]


def test_first_response_of_a_decoupled_model_is_its_first_response_not_its_last(
    latency_server: ServerProcess,
) -> None:
    items: queue.Queue[tuple[object, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(latency_server.grpc_url)
    client.start_stream(callback=lambda result, error: items.put((result, error)))
    inputs = []
    for name, values, dtype in (("IN", [1, 2], np.int32), ("DELAY", [0, 700], np.uint32), ("WAIT", [0], np.uint32)):
        t = grpcclient.InferInput(name, [len(values)], "INT32" if dtype is np.int32 else "UINT32")
        t.set_data_from_numpy(np.array(values, dtype))
        inputs.append(t)
    client.async_stream_infer("repeat_int32", inputs)
    answers = [items.get(timeout=60) for _ in range(2)]
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in answers), answers
    labels = {"model": "repeat_int32", "version": "1"}

    def recorded() -> bool:  # the request is recorded once the model is done with it, after its responses
        return series(scrape(latency_server)[1], "nv_inference_request_summary_us_count", **labels) == {
            frozenset(labels.items()): 1.0
        }

    wait_for("the stream's request recorded", recorded)
    _, m = scrape(latency_server)
    assert one(m, f"{FIRST}_count", **labels) == 1
    request_ms = one(m, "nv_inference_request_summary_us_sum", **labels) / 1000
    # the second response came 700 ms after the first; the request ended after it
    assert request_ms >= 700
    assert one(m, f"{FIRST}_sum", **labels) <= request_ms - 600


def test_without_the_flags_the_families_are_absent(plain_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(plain_server.http_url)
    client.infer("summarised", [_input(np.ones((1, 2), np.float32))])
    client.close()
    text, m = scrape(plain_server)
    for name in (*SUMMARIES, *CACHE_SUMMARIES, FIRST):
        assert name not in text
    assert one(m, "nv_inference_request_success", model="summarised", version="1") == 1
    assert series(m, "nv_inference_request_duration_us", model="summarised")


def test_custom_quantiles_and_no_latency_counters(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Triton's QA value, "0.0.1" read as std::stod reads it (0.0)
    srv = _start(
        tmp_path_factory,
        "quantiles",
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config",
        "summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01",
        "--metrics-config",
        "counter_latencies=false",
    )
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        client.infer("summarised", [_input(np.ones((1, 2), np.float32))])
        client.close()
        text, m = scrape(srv)
    finally:
        srv.terminate()
    quantiles = series(m, "nv_inference_queue_summary_us", model="summarised", version="1")
    assert sorted(dict(k)["quantile"] for k in quantiles) == ["0.1", "0.7", "0.75"]
    assert all(not math.isnan(v) for v in quantiles.values())
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert f"nv_inference_{name}_duration_us" not in text
    assert "nv_cache_num_hits_per_model" not in text  # Triton creates the per-model cache counters with them
    # ... but its cache summaries with the other summaries, with the same quantiles
    cache = series(m, "nv_cache_hit_summary_per_model", model="cached", version="1")
    assert sorted(dict(k)["quantile"] for k in cache) == ["0.1", "0.7", "0.75"]
    assert FIRST not in text
    assert one(m, "nv_inference_request_success", model="summarised", version="1") == 1


def test_a_malformed_setting_stops_the_server_as_triton_does(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    srv = start_server(repo, "--metrics-config", "summary_latencies", wait=False)
    try:
        wait_for("the server to stop", lambda: not srv.alive(), timeout=60)
    finally:
        if srv.alive():
            srv.terminate(10)
    assert srv.proc.returncode == 2
    assert "--metrics-config option format is <setting>=<value>. Got summary_latencies" in srv.log()
