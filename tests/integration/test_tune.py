"""``kubeinfer tune`` on a small model: a configuration within budget, written so that the server loads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.server.config import load_config_file
from kubeinfer.server.examples import models

from tests.support.repos import write_model
from tests.support.server import start_server

CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { }
"""
# a small grid and short windows: the test checks what tune does, not how fast anything is
QUICK = ["--instances", "1", "--max-batch-sizes", "2,8", "--delays-us", "100", "--max-concurrency", "2"]
QUICK += ["-p", "250", "-r", "1", "--warmup-seconds", "0.1"]


def tune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "tune", *args, *QUICK],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path / "repo", "add_sub", CONFIG, {1: models.add_sub(16)})
    return tmp_path / "repo"


def test_tune_writes_a_configuration_within_budget_that_the_server_loads(repo: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "tune.json", tmp_path / "tune.png"
    done = tune(str(repo / "add_sub"), "--p99-ms", "2000", "--write", "--json", str(out), "--plot", str(png))
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    best = document["best"]
    assert best["within_budget"] and best["best"]["p99_ms"] <= 2000 and best["best"]["errors"] == 0
    # staged search: 2 batch sizes, then a delay, then preferred batch sizes, every one in the table
    tried = [
        (t["max_batch_size"], t["max_queue_delay_microseconds"], t["preferred_batch_size"]) for t in document["tried"]
    ]
    assert (2, 0, []) in tried and (8, 0, []) in tried and any(delay == 100 for _, delay, _ in tried)
    assert any(preferred for _, _, preferred in tried)
    assert best["best"]["throughput"] == max(t["best"]["throughput"] for t in document["tried"] if t["best"])
    assert "maxBatchSize:" in done.stdout and "instanceGroup:" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    written = load_config_file(repo / "add_sub" / "config.pbtxt")
    assert written.max_batch_size == best["max_batch_size"]
    assert written.dynamic_batching.max_queue_delay_microseconds == best["max_queue_delay_microseconds"]
    assert list(written.dynamic_batching.preferred_batch_size) == best["preferred_batch_size"]
    assert written.instance_group[0].count == best["instances"]

    server = start_server(repo)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        config = client.get_model_config("add_sub")
        assert config["max_batch_size"] == best["max_batch_size"]
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
        client.close()
    finally:
        server.terminate()


def test_an_impossible_budget_writes_nothing(repo: Path) -> None:
    before = (repo / "add_sub" / "config.pbtxt").read_text()
    done = tune(str(repo / "add_sub"), "--p99-ms", "0.0001", "--write")
    assert done.returncode == 1
    assert "no configuration kept p99 within 0.0001 ms; nothing written" in done.stderr
    assert (repo / "add_sub" / "config.pbtxt").read_text() == before


def test_a_running_server_gets_its_own_configuration_back(repo: Path) -> None:
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "add_sub")
    try:
        before = httpx.get(f"{server.base_url}/v2/models/add_sub/config", timeout=10).json()
        done = tune("--url", server.http_url, "-m", "add_sub", "--p99-ms", "2000")
        assert done.returncode == 0, done.stderr
        assert "maxBatchSize:" in done.stdout
        config = httpx.get(f"{server.base_url}/v2/models/add_sub/config", timeout=10).json()
        assert config == before
        # the repository's config.pbtxt, normalised as Triton does (preferred_batch_size [max_batch_size])
        assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [8]
    finally:
        server.terminate()
