"""Statistics API and Prometheus metrics agree with what was sent, failures included."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import (
    Gate,
    infer_body,
    post_infer,
    require_sleep_backend,
    stats,
    wait_pending,
    write_sleep_model,
)
from tests.support.waiting import wait_for

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("metrics") / "repo"
    write_sleep_model(repo, "counted", 20, "dynamic_batching { max_queue_delay_microseconds: 5000 }\n")
    write_sleep_model(
        repo,
        "tiny_queue",
        0,
        """
        dynamic_batching { default_queue_policy { max_queue_size: 1 } }
    """,
        max_batch_size=1,
    )
    srv = start_server(repo, log_dir=repo.parent)
    yield srv
    srv.terminate()


def scrape(server: ServerProcess) -> tuple[str, dict[tuple[str, frozenset], float]]:
    text = httpx.get(server.metrics_url, timeout=10).text
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"unparsable exposition line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        samples[(m["name"], labels)] = float(m["value"])
    return text, samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def pending(server: ServerProcess, model: str) -> float:
    _, samples = scrape(server)
    return value(samples, "nv_inference_pending_request_count", model=model, version="1")


def test_counts_agree_with_requests_sent(server: ServerProcess, tmp_path: Path) -> None:
    ok_rows = [1, 2, 1, 3, 1, 1, 2, 1] * 4
    bad_input = [{"inputs": [{"name": "WRONG", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}] * 3
    backend_fail = [infer_body(fail=True)] * 2
    with Gate(tmp_path) as gate, ThreadPoolExecutor(16) as pool:
        # the first request holds the instance until two more queue behind it: they batch (executions < requests)
        bodies = [infer_body(rows=ok_rows[0], **gate.params)] + [infer_body(rows=r) for r in ok_rows[1:]]
        first = pool.submit(post_infer, server.base_url, "counted", bodies[0])
        gate.wait_entered()
        rest = [pool.submit(post_infer, server.base_url, "counted", b) for b in bodies[1:] + bad_input + backend_fail]
        wait_for("two queued requests", lambda: pending(server, "counted") >= 2)
        gate.open()
        results = [first.result()] + [f.result() for f in rest]
    statuses = [r[0] for r in results]
    assert statuses == [200] * len(bodies) + [400] * 3 + [500] * 2, statuses
    # tritonclient over gRPC counts the same way
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [2, 2], "FP32")
    inp.set_data_from_numpy(np.ones((2, 2), np.float32))
    client.infer("counted", [inp])
    grpc_stats = client.get_inference_statistics("counted", as_json=True)
    client.close()
    n_ok, rows = len(bodies) + 1, sum(ok_rows) + 2  # + the gRPC request (2 rows); failures count no rows

    s = stats(server.base_url, "counted")
    assert s["inference_stats"]["success"]["count"] == n_ok
    assert s["inference_stats"]["fail"]["count"] == 5
    assert s["inference_stats"]["queue"]["count"] == n_ok
    assert s["inference_stats"]["compute_infer"]["count"] == n_ok
    assert s["inference_count"] == rows  # successful inferences, batch-expanded (Triton's definition)
    assert s["execution_count"] < n_ok
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == s["inference_count"]
    assert sum(b["compute_infer"]["count"] for b in s["batch_stats"]) == s["execution_count"]
    assert s["last_inference"] > 1_600_000_000_000  # ms since the epoch
    assert int(grpc_stats["model_stats"][0]["inference_count"]) == s["inference_count"]

    _, m = scrape(server)
    labels = {"model": "counted", "version": "1"}
    assert value(m, "nv_inference_request_success", **labels) == n_ok
    assert value(m, "nv_inference_request_failure", reason="OTHER", **labels) == 3
    assert value(m, "nv_inference_request_failure", reason="BACKEND", **labels) == 2
    assert value(m, "nv_inference_request_failure", reason="REJECTED", **labels) == 0
    assert value(m, "nv_inference_count", **labels) == s["inference_count"]
    assert value(m, "nv_inference_exec_count", **labels) == s["execution_count"]
    assert value(m, "nv_inference_pending_request_count", **labels) == 0
    total_ns = s["inference_stats"]["success"]["ns"] + s["inference_stats"]["fail"]["ns"]
    assert value(m, "nv_inference_request_duration_us", **labels) == pytest.approx(total_ns / 1000, rel=1e-6)
    for key, metric in (
        ("queue", "queue"),
        ("compute_input", "compute_input"),
        ("compute_infer", "compute_infer"),
        ("compute_output", "compute_output"),
    ):
        ns = s["inference_stats"][key]["ns"]
        assert value(m, f"nv_inference_{metric}_duration_us", **labels) == pytest.approx(ns / 1000, rel=1e-6, abs=1)
    assert value(m, "kubeinfer_inference_request_duration_us_count", **labels) == n_ok + 5
    assert value(m, "kubeinfer_inference_request_duration_us_bucket", le="+Inf", **labels) == n_ok + 5
    assert value(m, "kubeinfer_inference_queue_duration_us_count", **labels) == n_ok


def test_rejections_are_counted_as_rejected(server: ServerProcess, tmp_path: Path) -> None:
    """One request executes (held), one queues (max_queue_size 1), four are rejected."""
    url = server.base_url
    with Gate(tmp_path) as gate, ThreadPoolExecutor(6) as pool:
        held = pool.submit(post_infer, url, "tiny_queue", infer_body(**gate.params))
        gate.wait_entered()
        queued = pool.submit(post_infer, url, "tiny_queue", infer_body())
        wait_pending(server.metrics_url, "tiny_queue", 1)
        refused = [pool.submit(post_infer, url, "tiny_queue", infer_body()) for _ in range(4)]
        statuses = [f.result()[0] for f in refused]  # while the gate is closed
        gate.open()
        statuses += [held.result()[0], queued.result()[0]]
    assert statuses == [503] * 4 + [200] * 2, statuses
    rejected, ok = 4, 2
    s = stats(server.base_url, "tiny_queue")
    assert s["inference_stats"]["success"]["count"] == ok
    assert s["inference_stats"]["fail"]["count"] == rejected
    _, m = scrape(server)
    labels = {"model": "tiny_queue", "version": "1"}
    assert value(m, "nv_inference_request_failure", reason="REJECTED", **labels) == rejected
    assert value(m, "nv_inference_request_success", **labels) == ok


def test_exposition_uses_tritons_names_and_types(server: ServerProcess) -> None:
    text, m = scrape(server)
    for name, kind in (
        ("nv_inference_request_success", "counter"),
        ("nv_inference_request_failure", "counter"),
        ("nv_inference_count", "counter"),
        ("nv_inference_exec_count", "counter"),
        ("nv_inference_request_duration_us", "counter"),
        ("nv_inference_queue_duration_us", "counter"),
        ("nv_inference_compute_input_duration_us", "counter"),
        ("nv_inference_compute_infer_duration_us", "counter"),
        ("nv_inference_compute_output_duration_us", "counter"),
        ("nv_inference_pending_request_count", "gauge"),
        ("kubeinfer_inference_request_duration_us", "histogram"),
        ("kubeinfer_inference_queue_duration_us", "histogram"),
        ("nv_cpu_utilization", "gauge"),
        ("nv_cpu_memory_total_bytes", "gauge"),
        ("nv_cpu_memory_used_bytes", "gauge"),
    ):
        assert f"# TYPE {name} {kind}\n" in text, name
    assert "_total{" not in text.replace("process_cpu_seconds_total", "")  # no prometheus-client suffixes
    assert "_created" not in text
    # a loaded model has its series before its first request, as in Triton
    assert ("nv_inference_request_success", frozenset({("model", "tiny_queue"), ("version", "1")})) in m
    assert 0 <= value(m, "nv_cpu_utilization") <= 1
    assert 0 < value(m, "nv_cpu_memory_used_bytes") <= value(m, "nv_cpu_memory_total_bytes")


def test_statistics_endpoints_shape(server: ServerProcess) -> None:
    everything = httpx.get(f"{server.base_url}/v2/models/stats", timeout=10).json()["model_stats"]
    assert {e["name"] for e in everything} == {"counted", "tiny_queue"}
    one = httpx.get(f"{server.base_url}/v2/models/counted/versions/1/stats", timeout=10).json()["model_stats"]
    assert len(one) == 1 and one[0]["version"] == "1"
    for key in (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ):
        assert set(one[0]["inference_stats"][key]) == {"count", "ns"}
    missing = httpx.get(f"{server.base_url}/v2/models/nope/stats", timeout=10)
    # Triton 2.51: 400 {"error":"requested model 'nope' is not available"}
    assert (missing.status_code, missing.json()) == (400, {"error": "requested model 'nope' is not available"})
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_inference_statistics("counted")["model_stats"][0]["name"] == "counted"
    client.close()
