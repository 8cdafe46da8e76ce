"""``kubeinfer perf`` against a live server: its counts are the server's, errors are counted, outputs are complete.

Short windows keep it quick; nothing here judges a speed (that is benchmarks/'s job).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubeinfer.server.examples import models
from kubeinfer.server.tools.perf.report import CSV_COLUMNS

from tests.support.https import make_ca_and_cert
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

ADD_SUB = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { }
"""
FAST = ["-p", "300", "-r", "3", "--warmup-seconds", "0.2"]
LEVEL_FIELDS = {
    "concurrency",
    "request_rate",
    "throughput",
    "requests_per_second",
    "requests",
    "errors",
    "error_messages",
    "avg_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "stable",
    "windows",
    "total_requests",
    "total_errors",
    "server",
    "client_cpu",
    "server_cpu",
}
SERVER_FIELDS = {"queue_us", "compute_input_us", "compute_infer_us", "compute_output_us", "success", "avg_batch"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("perf") / "repo"
    write_model(repo, "add_sub", ADD_SUB, {1: models.add_sub(16)})
    proc = start_server(repo)
    yield proc
    proc.terminate()


def counts(server: ServerProcess) -> tuple[int, int]:
    stats = httpx.get(f"{server.base_url}/v2/models/add_sub/stats", timeout=10).json()["model_stats"][0]
    inference = stats["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


def perf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "perf", "-m", "add_sub", *FAST, *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def run_json(
    server: ServerProcess, tmp_path: Path, *args: str
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    out = tmp_path / "perf.json"
    done = perf("--json", str(out), *args)
    assert out.exists(), done.stderr
    return json.loads(out.read_text()), done


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(["-i", "http", "--concurrency-range", "1:3:2"], id="http-concurrency"),
        pytest.param(["-i", "grpc", "--concurrency-range", "2"], id="grpc-concurrency"),
        pytest.param(["-i", "grpc", "--streaming", "--concurrency-range", "2"], id="grpc-streaming"),
        pytest.param(
            ["-i", "http", "--request-rate-range", "100", "--request-distribution", "poisson"], id="http-rate"
        ),
        pytest.param(["-i", "http", "--concurrency-range", "4", "--processes", "2"], id="http-2-processes"),
        pytest.param(["-i", "http", "--input-tensor-format", "json", "--output-tensor-format", "json"], id="http-json"),
    ],
)
def test_counts_equal_the_servers_statistics(server: ServerProcess, tmp_path: Path, load: list[str]) -> None:
    protocol = load[1]
    url = server.http_url if protocol == "http" else server.grpc_url
    before = counts(server)
    document, done = run_json(server, tmp_path, "-u", url, "--server-pid", str(server.proc.pid), *load)
    after = counts(server)
    assert done.returncode == 0, done.stderr
    levels = document["levels"]
    assert levels and all(LEVEL_FIELDS <= set(level) for level in levels)
    # every request perf completed, warm-up included, is one the server counted, and nothing else
    assert after[0] - before[0] == sum(level["total_requests"] for level in levels)
    assert after[1] - before[1] == 0
    for level in levels:
        assert level["requests"] > 0 and level["errors"] == 0 and level["total_errors"] == 0
        assert level["throughput"] > 0 and level["p50_ms"] <= level["p99_ms"] <= level["max_ms"]
        server_split = level["server"]
        assert SERVER_FIELDS <= set(server_split)
        # the statistics were read at the window boundaries too: only requests in flight there, and those
        # completed while one statistics call was answered (long on a loaded machine), differ
        in_flight = level["concurrency"] or 16
        assert abs(server_split["success"] - level["requests"]) <= 2 * in_flight + level["requests"] // 4
        assert level["server_cpu"]["us_per_request"] > 0 and level["client_cpu"]["percent_of_core"] >= 0
    if "--concurrency-range" in load and load[load.index("--concurrency-range") + 1] == "1:3:2":
        assert [level["concurrency"] for level in levels] == [1, 3]


def test_grpc_over_tls_with_perf_analyzers_flags(tmp_path: Path) -> None:
    """--ssl-grpc-use-ssl with --ssl-grpc-root-certifications-file: the load and the statistics calls go over TLS
    (a plain client is refused by a TLS server, so the counts prove it)."""
    repo = tmp_path / "repo"
    write_model(repo, "add_sub", ADD_SUB, {1: models.add_sub(16)})
    ca, cert, key = make_ca_and_cert(tmp_path)
    tls = start_server(repo, "--grpc-use-ssl", "true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key))
    try:
        flags = ["--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(ca)]
        document, done = run_json(tls, tmp_path, "-i", "grpc", "-u", tls.grpc_url, "--concurrency-range", "2", *flags)
        assert done.returncode == 0, done.stderr
        (level,) = document["levels"]
        assert level["requests"] > 0 and level["errors"] == 0 and level["server"]["success"] > 0
        plain = perf("-i", "grpc", "-u", tls.grpc_url, "--concurrency-range", "2")
        assert plain.returncode != 0
    finally:
        assert tls.terminate() == 0


def test_errors_are_counted_with_the_servers_message(server: ServerProcess, tmp_path: Path) -> None:
    """Half the steps of the input data have the wrong shape: each of those requests is an error."""
    data = tmp_path / "data.json"
    good = {"INPUT0": list(range(16)), "INPUT1": list(range(16))}
    bad = {"INPUT0": {"content": list(range(8)), "shape": [8]}, "INPUT1": list(range(16))}
    data.write_text(json.dumps({"data": [good, bad]}))
    before = counts(server)
    document, done = run_json(server, tmp_path, "-u", server.http_url, "--input-data", str(data))
    after = counts(server)
    assert done.returncode == 1, "errors must show in the exit status"
    (level,) = document["levels"]
    assert level["errors"] > 0 and level["requests"] > 0
    assert after[1] - before[1] == level["total_errors"]
    assert after[0] - before[0] == level["total_requests"]
    # the steps alternate on one connection: as many failures as successes, give or take one
    assert abs(level["total_errors"] - level["total_requests"]) <= 1
    (message,) = level["error_messages"]
    assert message.startswith("HTTP 400") and "INPUT0" in message
    assert "INPUT0" in done.stdout  # the table lists the errors with their message


def test_csv_json_and_plot_files(server: ServerProcess, tmp_path: Path) -> None:
    out_csv, out_png, out_json = tmp_path / "perf.csv", tmp_path / "perf.png", tmp_path / "perf.json"
    done = perf(
        "-u",
        server.grpc_url,
        "-i",
        "grpc",
        "--concurrency-range",
        "1:2",
        "-f",
        str(out_csv),
        "--plot",
        str(out_png),
        "--json",
        str(out_json),
    )
    assert done.returncode == 0, done.stderr
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_COLUMNS
    assert [row["Concurrency"] for row in rows] == ["1", "2"]
    document = json.loads(out_json.read_text())
    for row, level in zip(rows, document["levels"], strict=True):
        assert int(row["Requests"]) == level["requests"]
        assert int(row["p99 latency"]) == round(level["p99_ms"] * 1000)
    assert {"model", "protocol", "url", "batch_size", "settings", "levels"} <= set(document)
    png = out_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and len(png) > 5000
    assert "pass [1]" in done.stderr  # progress, window by window


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "NOPE:1"], "not an input of model"),
        (["--concurrency-range", "4:2"], "end is below the start"),
        (["-b", "9"], "larger than the model's max_batch_size 8"),
        (["--input-data", "/does/not/exist"], "expected random, zero"),
    ],
)
def test_bad_options_are_refused_clearly(server: ServerProcess, args: list[str], message: str) -> None:
    done = perf("-u", server.http_url, *args)
    assert done.returncode == 2 and message in done.stderr


def test_a_model_that_does_not_exist(server: ServerProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "perf", "-m", "nope", "-u", server.http_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "model metadata of 'nope': HTTP 404" in done.stderr
