"""A version's cold start, phase by phase, on a real server process: the repository index row of a serving
version carries ``cold_start`` (load, warm-up, first successful inference), the phases are monotonic and add
up to the wall clock of the load the client saw, and each shows as a sample of
``kubeinfer_model_load_duration_seconds{phase}`` (with Triton's ``nv_model_load_duration_secs`` gauge)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import infer_body, require_sleep_backend, write_sleep_model

LOAD_MS = 400  # each instance's load (the sleep backend's load_ms)
SLEEP_MS = 100  # each execution, warm-up samples included
WARMUP = """
model_warmup [ { name: "w" batch_size: 1 count: 3
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("cold") / "repo"
    body = f'parameters {{ key: "load_ms" value {{ string_value: "{LOAD_MS}" }} }}\n' + WARMUP
    write_sleep_model(repo, "slow", SLEEP_MS, body)
    srv = start_server(repo, "--model-control-mode=explicit", log_dir=repo.parent)
    yield srv
    srv.terminate()


def _row(server: ServerProcess, name: str) -> dict[str, Any]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    (row,) = [r for r in rows if r["name"] == name and r.get("version") == "1"]
    return row


def _samples(server: ServerProcess, family: str) -> dict[frozenset[tuple[str, str]], float]:
    out = {}
    for line in httpx.get(server.metrics_url, timeout=10).text.splitlines():
        m = re.match(rf"^{family}\{{([^}}]*)\}} (\S+)$", line)
        if m:
            out[frozenset(re.findall(r'(\w+)="([^"]*)"', m[1]))] = float(m[2])
    return out


def _labels(**kw: str) -> frozenset[tuple[str, str]]:
    return frozenset(kw.items())


def test_phases_are_reported_monotonic_and_add_up_to_the_load(server: ServerProcess) -> None:
    before = time.time()
    started = time.monotonic()
    r = httpx.post(f"{server.base_url}/v2/repository/models/slow/load", timeout=60)
    wall = time.monotonic() - started
    after = time.time()
    assert r.status_code == 200, r.text

    row = _row(server, "slow")
    assert row["state"] == "READY"
    cold = row["cold_start"]
    print(f"cold start of 'slow' v1: {cold}; load request took {wall:.3f}s")
    assert set(cold) == {"started_at", "load_seconds", "warmup_seconds", "ready_at"}  # no inference yet
    # each phase took at least what the model makes it take
    assert cold["load_seconds"] >= LOAD_MS / 1000
    assert cold["warmup_seconds"] >= 3 * SLEEP_MS / 1000
    # monotonic, inside the client's window
    assert before - 0.01 <= cold["started_at"] <= cold["ready_at"] <= after + 0.01
    assert cold["ready_at"] == pytest.approx(cold["started_at"] + cold["load_seconds"] + cold["warmup_seconds"])
    # the phases are the load: what the request took beyond them is HTTP and the folder scan
    phases = cold["load_seconds"] + cold["warmup_seconds"]
    assert phases <= wall
    assert wall - phases < max(0.3, 0.2 * wall), (wall, cold)

    # the first successful request completes the cold start; later ones change nothing
    t0 = time.time()
    r = httpx.post(f"{server.base_url}/v2/models/slow/infer", json=infer_body(), timeout=30)
    assert r.status_code == 200, r.text
    t1 = time.time()
    first = _row(server, "slow")["cold_start"]
    assert cold["ready_at"] <= t0 - 0.01 < first["first_inference_at"] <= t1 + 0.01
    assert SLEEP_MS / 1000 <= first["first_inference_seconds"] <= t1 - t0
    httpx.post(f"{server.base_url}/v2/models/slow/infer", json=infer_body(), timeout=30).raise_for_status()
    assert _row(server, "slow")["cold_start"] == first

    # one histogram sample per phase, the same seconds as the index
    counts = _samples(server, "kubeinfer_model_load_duration_seconds_count")
    sums = _samples(server, "kubeinfer_model_load_duration_seconds_sum")
    for phase, seconds in (
        ("load", first["load_seconds"]),
        ("warmup", first["warmup_seconds"]),
        ("first_inference", first["first_inference_seconds"]),
    ):
        key = _labels(model="slow", version="1", phase=phase)
        assert counts[key] == 1, (phase, counts)
        assert sums[key] == pytest.approx(seconds, abs=1e-5)
    buckets = _samples(server, "kubeinfer_model_load_duration_seconds_bucket")
    assert buckets[_labels(model="slow", version="1", phase="load", le="0.25")] == 0
    assert buckets[_labels(model="slow", version="1", phase="load", le="+Inf")] == 1
    gauge = _samples(server, "nv_model_load_duration_secs")
    assert gauge[_labels(model="slow", version="1")] == pytest.approx(phases, abs=1e-5)


def test_a_reload_is_a_new_cold_start_and_an_unload_drops_the_gauge(server: ServerProcess) -> None:
    httpx.post(f"{server.base_url}/v2/repository/models/slow/load", timeout=60).raise_for_status()
    first = _row(server, "slow")["cold_start"]
    # a load with a changed config builds the version again
    override = json.dumps(
        {
            "backend": "sleep",
            "max_batch_size": 4,
            "parameters": {"load_ms": {"string_value": str(LOAD_MS)}, "sleep_ms": {"string_value": str(SLEEP_MS)}},
        }
    )
    config = {"parameters": {"config": override}}
    r = httpx.post(f"{server.base_url}/v2/repository/models/slow/load", json=config, timeout=60)
    assert r.status_code == 200, r.text
    again = _row(server, "slow")["cold_start"]
    assert again["started_at"] > first["ready_at"] - 0.01
    assert "first_inference_at" not in again  # the new version has served nothing yet
    assert again["warmup_seconds"] == 0  # the override has no warm-up samples
    counts = _samples(server, "kubeinfer_model_load_duration_seconds_count")
    assert counts[_labels(model="slow", version="1", phase="load")] >= 2

    httpx.post(f"{server.base_url}/v2/repository/models/slow/unload", timeout=60).raise_for_status()
    deadline = time.monotonic() + 10
    while _samples(server, "nv_model_load_duration_secs") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _labels(model="slow", version="1") not in _samples(server, "nv_model_load_duration_secs")
    # the histogram keeps what happened (Prometheus series are cumulative)
    assert (
        _samples(server, "kubeinfer_model_load_duration_seconds_count")[
            _labels(model="slow", version="1", phase="load")
        ]
        >= 2
    )


def test_the_server_reports_its_start_up_timeline(tmp_path) -> None:
    require_sleep_backend()
    repo = tmp_path / "repo"
    write_sleep_model(repo, "slow", 0, f'parameters {{ key: "load_ms" value {{ string_value: "{LOAD_MS}" }} }}\n')
    before = time.time()
    srv = start_server(repo, log_dir=tmp_path)
    try:
        after = time.time()
        startup = httpx.get(f"{srv.base_url}/v2/kubeinfer/startup", timeout=10).json()
        print(f"start-up timeline: {startup} (client: {before:.3f} → {after:.3f})")
        # the process began after the client started it, listened, then loaded its model (load_ms) and was ready
        assert before - 0.5 <= startup["started_at"] <= startup["listening_at"] <= startup["models_ready_at"] <= after
        assert startup["models_ready_at"] - startup["listening_at"] >= LOAD_MS / 1000
        cold = _row(srv, "slow")["cold_start"]
        assert startup["listening_at"] <= cold["started_at"] <= cold["ready_at"] <= startup["models_ready_at"] + 0.01
    finally:
        srv.terminate()
