"""Instance groups: count/kind/gpus, instances executing in parallel, several models at once.

Parallelism is seen, not timed: requests are held at a gate (the ``sleep`` test backend) and the test
counts how many executions reached it before opening it.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from kubeinfer.server.runtime import devices

from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import (
    Gate,
    infer_body,
    output,
    post_infer,
    require_sleep_backend,
    wait_pending,
    write_sleep_model,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("instances") / "repo"
    write_sleep_model(repo, "single", 0, "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    write_sleep_model(repo, "double", 0, "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    write_sleep_model(
        repo,
        "two_groups",
        0,
        """
        instance_group [ { count: 2 kind: KIND_CPU }, { name: "extra" count: 1 kind: KIND_AUTO } ]
    """,
    )
    write_sleep_model(
        repo,
        "batched_double",
        0,
        """
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """,
        max_batch_size=1,
    )
    write_sleep_model(repo, "other", 0, "")
    write_sleep_model(repo, "on_gpu", 0, "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 7 ] } ]\n")
    write_model(
        repo,
        "add_sub",
        """
        name: "add_sub"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """,
        {1: models.add_sub(16)},
    )
    srv = start_server(repo, log_dir=repo.parent)
    yield srv
    srv.terminate()


def _held(server: ServerProcess, gate: Gate, model_names: list[str], executing: int) -> list[dict]:
    """Send one request per name, all held at ``gate``; wait until ``executing`` of them run at once, then
    open the gate and return the answers."""
    with ThreadPoolExecutor(len(model_names)) as pool:
        futures = [pool.submit(post_infer, server.base_url, m, infer_body(**gate.params)) for m in model_names]
        gate.wait_entered(executing)
        gate.open()
        results = [f.result() for f in futures]
    for status, answer, _ in results:
        assert status == 200, answer
    return [answer for _, answer, _ in results]


def test_one_instance_runs_requests_one_after_another(server: ServerProcess, tmp_path: Path) -> None:
    with Gate(tmp_path) as gate, ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(post_infer, server.base_url, "single", infer_body(**gate.params)) for _ in range(2)]
        gate.wait_entered(1)
        wait_pending(server.metrics_url, "single", 1)  # the second waits for the only instance
        assert gate.entered() == 1
        gate.open()
        answers = [f.result()[1] for f in futures]
    assert gate.entered() == 2
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0}


def test_two_instances_run_in_parallel(server: ServerProcess, tmp_path: Path) -> None:
    with Gate(tmp_path) as gate:
        answers = _held(server, gate, ["double", "double"], executing=2)
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0, 1}


def test_every_group_contributes_instances(server: ServerProcess, tmp_path: Path) -> None:
    with Gate(tmp_path) as gate:
        answers = _held(server, gate, ["two_groups"] * 3, executing=3)
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0, 1, 2}


def test_batcher_feeds_every_free_instance(server: ServerProcess, tmp_path: Path) -> None:
    with Gate(tmp_path) as gate:
        answers = _held(server, gate, ["batched_double"] * 2, executing=2)
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0, 1}


def test_several_models_execute_concurrently(server: ServerProcess, tmp_path: Path) -> None:
    with Gate(tmp_path) as gate:
        _held(server, gate, ["single", "other"], executing=2)


def test_gpu_group_without_that_gpu_fails_to_load_with_a_reason(server: ServerProcess) -> None:
    if devices.gpu_count() > 7:
        pytest.skip("this machine has a GPU 7: the KIND_GPU group would load")
    index = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    (entry,) = [e for e in index if e["name"] == "on_gpu"]
    assert entry["state"] == "UNAVAILABLE"
    # Triton's words (core ValidateInstanceGroup)
    assert "of model on_gpu specifies invalid or unsupported gpu id 7. GPUs with at least" in entry["reason"], entry
    status, answer, _ = post_infer(server.base_url, "on_gpu", infer_body())
    # Triton's answer for a model whose load failed: UNAVAILABLE, with the load's reason
    assert status == 503, answer
    assert answer["error"] == f"Request for unknown model: 'on_gpu' has no available versions: {entry['reason']}"


def test_onnx_instances_in_parallel_compute_correctly(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    rng = np.random.default_rng(0)
    try:
        jobs = []
        for _ in range(40):
            a, b = rng.standard_normal((2, 1, 16)).astype(np.float32)
            inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            jobs.append((a, b, client.async_infer("add_sub", inputs)))
        for a, b, job in jobs:
            result = job.get_result()
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
            np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    finally:
        client.close()
