"""Response cache: per-model enable, the server-wide size flag, Triton's hit/miss statistics and metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.runtime.cache import footprint
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{cache}
"""


def _repo(root: Path) -> Path:
    repo = root / "repo"
    model = test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])
    write_model(repo, "cached", CONFIG.format(name="cached", cache="response_cache { enable: true }"), {1: model})
    write_model(repo, "uncached", CONFIG.format(name="uncached", cache=""), {1: model})
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(_repo(tmp_path_factory.mktemp("cache")), "--cache-config=local,size=1048576")
    yield server
    server.terminate()


def _inputs(mod: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [mod.InferInput("A", list(a.shape), "FP32"), mod.InferInput("B", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/v2/models/{model}/stats").json()["model_stats"][0]


def _metric(server: ServerProcess, line_start: str) -> float:
    for line in httpx.get(server.metrics_url).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starting with {line_start}")


def test_identical_requests_hit_over_both_protocols(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    before = _stats(server, "cached")
    first = http.infer("cached", _inputs(httpclient, a, b)).as_numpy("OUT")
    second = grpc.infer("cached", _inputs(grpcclient, a, b)).as_numpy("OUT")  # same key over gRPC
    third = http.infer("cached", _inputs(httpclient, a, b)).as_numpy("OUT")
    np.testing.assert_array_equal(first, a + b)
    np.testing.assert_array_equal(second, a + b)
    np.testing.assert_array_equal(third, a + b)
    after = _stats(server, "cached")
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["cache_miss"]["count"] - old["cache_miss"]["count"] == 1
    assert stats["cache_hit"]["count"] - old["cache_hit"]["count"] == 2
    assert stats["cache_hit"]["ns"] > old["cache_hit"]["ns"]
    # Triton: hits are successful requests but not inferences or executions
    assert stats["success"]["count"] - old["success"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["execution_count"] - before["execution_count"] == 1
    labels = '{model="cached",version="1"}'
    assert _metric(server, f"nv_cache_num_hits_per_model{labels}") >= 2
    assert _metric(server, f"nv_cache_num_misses_per_model{labels}") >= 1
    assert _metric(server, f"nv_cache_hit_duration_per_model{labels}") > 0
    assert _metric(server, "nv_cache_num_entries") >= 1


def test_different_inputs_or_outputs_miss(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.full((1, 4), 7, dtype=np.float32)
    b = np.full((1, 4), 3, dtype=np.float32)
    before = _stats(server, "cached")["inference_stats"]
    client.infer("cached", _inputs(httpclient, a, b))
    client.infer("cached", _inputs(httpclient, a, b + 1))  # other data
    client.infer("cached", _inputs(httpclient, a.reshape(1, 4), b), outputs=[httpclient.InferRequestedOutput("OUT")])
    after = _stats(server, "cached")["inference_stats"]
    assert after["cache_miss"]["count"] - before["cache_miss"]["count"] == 3
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"]


def test_models_without_response_cache_are_not_cached(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.ones((1, 4), dtype=np.float32)
    for _ in range(3):
        client.infer("uncached", _inputs(httpclient, a, a))
    stats = _stats(server, "uncached")
    assert stats["inference_stats"]["cache_hit"]["count"] == 0
    assert stats["inference_stats"]["cache_miss"]["count"] == 0
    assert stats["execution_count"] == 3
    assert 'nv_cache_num_hits_per_model{model="uncached"' not in httpx.get(server.metrics_url).text


#: what one response of "cached" (one [1, 4] FP32 output) holds in the cache, key and objects included
ENTRY = footprint(bytes(16), {"OUT": np.zeros((1, 4), np.float32)})


def test_a_small_cache_evicts_least_recently_used(tmp_path: Path) -> None:
    # room for three entries
    server = start_server(_repo(tmp_path), f"--response-cache-byte-size={3 * ENTRY + ENTRY // 2}")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        rows = [np.full((1, 4), i, dtype=np.float32) for i in range(4)]
        for r in rows:  # four distinct requests: the first is evicted
            client.infer("cached", _inputs(httpclient, r, r))
        assert _metric(server, "nv_cache_num_evictions") == 1
        assert _metric(server, "nv_cache_num_entries") == 3
        before = _stats(server, "cached")["inference_stats"]
        client.infer("cached", _inputs(httpclient, rows[3], rows[3]))  # still cached
        client.infer("cached", _inputs(httpclient, rows[0], rows[0]))  # evicted: computed again
        after = _stats(server, "cached")["inference_stats"]
        assert after["cache_hit"]["count"] - before["cache_hit"]["count"] == 1
        assert after["cache_miss"]["count"] - before["cache_miss"]["count"] == 1
    finally:
        server.terminate()


def test_many_tiny_responses_fill_the_cache_by_what_they_hold(tmp_path: Path) -> None:
    """Issue 23: entries count their whole footprint (tests/unit/test_response_cache_footprint.py measures
    it), not only their 16 tensor bytes: a 64 KiB cache takes ~85 one-row responses, not ~2,000."""
    size = 64 * 1024
    server = start_server(_repo(tmp_path), f"--cache-config=local,size={size}")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for i in range(300):
            row = np.full((1, 4), i, dtype=np.float32)
            client.infer("cached", _inputs(httpclient, row, row))
        entries = _metric(server, "nv_cache_num_entries")
        assert entries == size // ENTRY
        assert ENTRY > 10 * (16 + 16)  # the old count: 16 key bytes + 16 tensor bytes, so ~2,000 entries fitted
        assert _metric(server, "nv_cache_num_evictions") == 300 - entries
        assert _metric(server, "nv_cache_util") <= 1.0
    finally:
        server.terminate()


def test_enabled_in_config_without_a_server_cache_runs_uncached(tmp_path: Path) -> None:
    server = start_server(_repo(tmp_path))
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        a = np.ones((1, 4), dtype=np.float32)
        client.infer("cached", _inputs(grpcclient, a, a))
        client.infer("cached", _inputs(grpcclient, a, a))
        stats = _stats(server, "cached")
        assert stats["execution_count"] == 2
        assert stats["inference_stats"]["cache_miss"]["count"] == 0
        assert (
            "model 'cached' enables response_cache but is not cached: the server has no response cache" in server.log()
        )
    finally:
        server.terminate()


def test_a_redis_cache_without_an_address_is_refused_in_tritons_words(tmp_path: Path) -> None:
    """(The Redis cache itself: tests/integration/test_redis_cache.py.)"""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.server",
            f"--model-repository={_repo(tmp_path)}",
            "--cache-config=redis,host=x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Must at a minimum specify 'host' and 'port'" in proc.stderr
