"""Instance groups: count/kind/gpus, instances executing in parallel, several models at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from kubeinfer.server.runtime import devices

from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import infer_body, output, post_infer, require_sleep_backend, write_sleep_model

SLEEP_MS = 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("instances") / "repo"
    write_sleep_model(repo, "single", SLEEP_MS, "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    write_sleep_model(repo, "double", SLEEP_MS, "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    write_sleep_model(
        repo,
        "two_groups",
        SLEEP_MS,
        """
        instance_group [ { count: 2 kind: KIND_CPU }, { name: "extra" count: 1 kind: KIND_AUTO } ]
    """,
    )
    write_sleep_model(
        repo,
        "batched_double",
        SLEEP_MS,
        """
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """,
        max_batch_size=1,
    )
    write_sleep_model(repo, "other", SLEEP_MS, "")
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


def _concurrently(server: ServerProcess, model_names: list[str]) -> tuple[float, list[dict]]:
    start = time.monotonic()
    with ThreadPoolExecutor(len(model_names)) as pool:
        results = list(pool.map(lambda m: post_infer(server.base_url, m, infer_body()), model_names))
    elapsed = time.monotonic() - start
    for status, answer, _ in results:
        assert status == 200, answer
    return elapsed, [answer for _, answer, _ in results]


def test_one_instance_runs_requests_one_after_another(server: ServerProcess) -> None:
    elapsed, answers = _concurrently(server, ["single", "single"])
    assert elapsed >= 2 * SLEEP_MS / 1000 * 0.95
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0}


def test_two_instances_run_in_parallel(server: ServerProcess) -> None:
    single, _ = _concurrently(server, ["double"])
    elapsed, answers = _concurrently(server, ["double", "double"])
    assert elapsed < 1.6 * max(single, SLEEP_MS / 1000), (elapsed, single)
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0, 1}


def test_every_group_contributes_instances(server: ServerProcess) -> None:
    elapsed, answers = _concurrently(server, ["two_groups"] * 3)
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0, 1, 2}
    assert elapsed < 1.6 * 1.5 * SLEEP_MS / 1000  # far from the 3 s of serial execution


def test_batcher_feeds_every_free_instance(server: ServerProcess) -> None:
    elapsed, answers = _concurrently(server, ["batched_double"] * 2)
    assert {int(output(a, "INSTANCE")[0, 0]) for a in answers} == {0, 1}
    assert elapsed < 1.6 * SLEEP_MS / 1000


def test_several_models_execute_concurrently(server: ServerProcess) -> None:
    elapsed, _ = _concurrently(server, ["single", "other"])
    assert elapsed < 1.6 * SLEEP_MS / 1000


def test_gpu_group_without_that_gpu_fails_to_load_with_a_reason(server: ServerProcess) -> None:
    if devices.gpu_count() > 7:
        pytest.skip("this machine has a GPU 7: the KIND_GPU group would load")
    index = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    (entry,) = [e for e in index if e["name"] == "on_gpu"]
    assert entry["state"] == "UNAVAILABLE"
    assert "gpu 7" in entry["reason"].lower() or "no gpu" in entry["reason"].lower(), entry
    status, _, _ = post_infer(server.base_url, "on_gpu", infer_body())
    assert status in (400, 404, 503)


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
