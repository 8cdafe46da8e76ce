"""``--rate-limit=execution_count``: instances run only with their resources, by priority (Triton's
qa/L0_rate_limiter, ported to the ``sleep`` test backend: a gate shows what executes at once)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import Gate, infer_body, post_infer, require_sleep_backend, stats, write_sleep_model

ONE_R = 'instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]\n'


def _group(resource: str, priority: int) -> str:
    return (
        f'instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ resources [ {{ name: "{resource}" count: 1 }} ]'
        f" priority: {priority} }} }} ]\n"
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("rate_limiter") / "repo"
    write_sleep_model(repo, "a", 0, ONE_R)
    write_sleep_model(repo, "b", 0, ONE_R)
    write_sleep_model(repo, "batched", 0, ONE_R + "dynamic_batching { }\n", max_batch_size=1)
    write_sleep_model(repo, "high", 20, _group("P", 1))
    write_sleep_model(repo, "low", 20, _group("P", 2))
    return repo


@pytest.fixture(scope="module")
def limited(repo: Path) -> Iterator[ServerProcess]:
    srv = start_server(repo, "--rate-limit=execution_count", log_dir=repo.parent)
    yield srv
    srv.terminate()


def _entered_together(server: ServerProcess, tmp_path: Path, models: list[str]) -> int:
    """Send one gated request per model; how many executed at once before the gate opened."""
    with Gate(tmp_path) as gate, ThreadPoolExecutor(len(models)) as pool:
        futures = [pool.submit(post_infer, server.base_url, m, infer_body(**gate.params)) for m in models]
        gate.wait_entered(1)
        time.sleep(0.5)  # time for another execution to start, were it allowed
        together = gate.entered()
        gate.open()
        assert [f.result()[0] for f in futures] == [200] * len(models)
    return together


def test_one_resource_runs_one_model_at_a_time(limited: ServerProcess, tmp_path: Path) -> None:
    assert _entered_together(limited, tmp_path, ["a", "b"]) == 1
    assert _entered_together(limited, tmp_path, ["a", "batched"]) == 1


def test_off_ignores_rate_limiter_sections(repo: Path, tmp_path: Path) -> None:
    srv = start_server(repo, log_dir=repo.parent)  # --rate-limit=off is the default
    try:
        assert _entered_together(srv, tmp_path, ["a", "b"]) == 2
    finally:
        srv.terminate()


def test_plenty_of_resources_runs_both(repo: Path, tmp_path: Path) -> None:
    srv = start_server(repo, "--rate-limit=execution_count", "--rate-limit-resource=R:2", "--rate-limit-resource=P:1")
    try:
        assert _entered_together(srv, tmp_path, ["a", "b"]) == 2
    finally:
        srv.terminate()


def test_priority_shares_executions(limited: ServerProcess) -> None:
    """Two models contend for one resource: priority 1 gets about twice the executions of priority 2
    (Triton's test_cross_model_prioritization_limited_resource asks for a ratio above 1.8)."""
    before = {m: stats(limited.base_url, m)["inference_count"] for m in ("high", "low")}
    stop = time.monotonic() + 2.0

    def client(model: str) -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop:
                http.post(f"{limited.base_url}/v2/models/{model}/infer", json=infer_body()).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, ["high", "low"] * 4))
    done = {m: stats(limited.base_url, m)["inference_count"] - before[m] for m in ("high", "low")}
    assert done["low"] > 0
    assert 1.5 < done["high"] / done["low"] < 2.6, done
    # time waiting for the resource counts as queue time, as in Triton
    s = stats(limited.base_url, "low")["inference_stats"]
    assert int(s["queue"]["ns"]) / int(s["queue"]["count"]) > 5_000_000


def test_too_few_resources_fail_the_load_with_tritons_message(repo: Path) -> None:
    srv = start_server(repo, "--rate-limit=execution_count", "--rate-limit-resource=R:0", "--rate-limit-resource=P:1")
    try:
        index = httpx.post(f"{srv.base_url}/v2/repository/index", json={}, timeout=10).json()
        reasons = {m["name"]: m.get("reason", "") for m in index}
        expected = (
            'Resource count for "R" is limited to 0 which will prevent scheduling of one or more model instances, '
            "the minimum required count is 1"
        )
        assert expected in reasons["a"]
        assert reasons["high"] == ""
    finally:
        srv.terminate()


def test_bad_resource_flag(repo: Path) -> None:
    srv = start_server(repo, "--rate-limit-resource=R", wait=False)
    assert srv.proc.wait(timeout=30) != 0
    assert "--rate-limit-resource option format is" in srv.log()
