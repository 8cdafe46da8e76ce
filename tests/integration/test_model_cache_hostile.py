"""Models on demand under a hostile caller (issue 37, item 6), on real server processes.

Any client that can send a request can make a model load, so: a slow load holds up neither requests to
loaded models nor another model's load (no lock across a load); a load that runs past
``--model-load-abandon-seconds`` is abandoned, its requests answered and the model refused until the load
returned and the back-off passed; a model bigger than the whole budget is refused with the reason instead
of loading; callers cycling through more models than the budget holds hit
``--model-cache-swaps-per-minute`` and are told to try again, while the models that fit stay loaded and
keep answering. The models are the test backend's ``sleep`` models: ``load_ms`` makes a load slow (its
thread sleeps) and ``load_bytes`` gives a model a footprint.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import require_sleep_backend, write_sleep_model
from tests.support.waiting import wait_for

MiB = 1 << 20
THRASHED = [f"t{i}" for i in range(8)]  # 8 MiB each
SLOW_LOAD_MS = 4000


def _holding(mib: int, load_ms: int = 0) -> str:
    body = f'parameters {{ key: "load_bytes" value {{ string_value: "{mib * MiB}" }} }}\n'
    if load_ms:
        body += f'parameters {{ key: "load_ms" value {{ string_value: "{load_ms}" }} }}\n'
    return body + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("hostile") / "repo"
    write_sleep_model(repo, "slow", 0, _holding(1, SLOW_LOAD_MS))
    for name in THRASHED:
        write_sleep_model(repo, name, 0, _holding(8))
    write_sleep_model(repo, "big", 0, _holding(32))
    folder = write_sleep_model(repo, "bigfiles", 0, _holding(1))
    (folder / "1" / "weights.bin").write_bytes(b"\0" * (16 * MiB))
    return repo


def _body() -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


def _infer(server: ServerProcess, model: str) -> tuple[int, str, float]:
    """(status, error text or "", seconds) of one inference over HTTP."""
    started = time.monotonic()
    r = httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=_body(), timeout=60)
    error = r.json().get("error", "") if r.status_code != 200 else ""
    return r.status_code, error, time.monotonic() - started


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", timeout=10).json()
    return {r["name"]: r for r in rows}


def _sum(server: ServerProcess, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in httpx.get(server.metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_slow_load_holds_up_neither_loaded_models_nor_another_load(repo: Path) -> None:
    """While 'slow' takes 4 s to load, the loaded t0 answers at once and t1 loads and answers: nothing
    waits for the slow load (before, every load and eviction queued behind one lock)."""
    server = start_server(repo, "--model-cache-memory-budget=64Mi", "--model-load-timeout=30", log_dir=repo.parent)
    try:
        assert _infer(server, "t0")[0] == 200
        answered: dict[str, float] = {}

        def slow() -> None:
            status, error, _ = _infer(server, "slow")
            assert status == 200, error
            answered["slow"] = time.monotonic()

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.5)  # the slow load is under way
        status, error, seconds = _infer(server, "t0")
        assert status == 200 and seconds < 1.0, (status, error, seconds)
        status, error, seconds = _infer(server, "t1")  # not loaded: loads beside the slow one
        assert status == 200 and seconds < 2.5, (status, error, seconds)
        assert "slow" not in answered  # t1 was answered while the slow load still ran
        thread.join(30)
        assert "slow" in answered
        assert {n for n, r in _index(server).items() if r["state"] == "READY"} == {"t0", "t1", "slow"}
    finally:
        server.terminate()


def test_a_load_past_the_abandon_time_is_abandoned_reported_and_retried_later(repo: Path) -> None:
    """'slow' loads in 4 s and is given 1.5: its request gets 503 after 1.5 s; while that load still runs
    the model is refused at once (HTTP and gRPC) and the index says why; other models load meanwhile;
    once the load returned, what it loaded is unloaded, and after the back-off a request tries again."""
    server = start_server(
        repo,
        "--model-load-on-demand=true",
        "--model-load-abandon-seconds=1.5",
        "--model-load-timeout=30",
        log_dir=repo.parent,
    )
    abandoned = "Request for unknown model: 'slow' has no available versions: its load did not finish within 1.5s"
    try:
        status, error, seconds = _infer(server, "slow")
        assert status == 503, error
        assert error.startswith(abandoned) and "(--model-load-abandon-seconds) and was abandoned" in error
        assert 1.3 <= seconds < 3.5, seconds
        status, error, seconds = _infer(server, "slow")
        assert status == 503 and seconds < 0.5, (status, error, seconds)
        assert error.startswith(abandoned) and "not loaded again before that load has returned" in error
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            x = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
            x.set_data_from_numpy(np.ones((1, 2), np.float32))
            with pytest.raises(InferenceServerException) as err:
                client.infer("slow", [x])
            assert err.value.status() == "StatusCode.UNAVAILABLE"
            assert "was abandoned" in err.value.message()
        finally:
            client.close()
        row = _index(server)["slow"]
        assert row["state"] == "UNAVAILABLE" and "was abandoned" in row["reason"], row
        assert _infer(server, "t0")[0] == 200  # another model loads while the abandoned load runs

        wait_for("the abandoned load returned", lambda: "abandoned load of 'slow' returned" in server.log(), 15)
        row = _index(server)["slow"]
        assert row["state"] == "UNAVAILABLE" and "was abandoned" in row["reason"], row  # not served
        status, error, seconds = _infer(server, "slow")
        assert status == 503 and seconds < 0.5 and "a request loads it again in" in error, (status, error)

        time.sleep(1.6)  # the back-off: as long again as the load was given
        status, error, seconds = _infer(server, "slow")
        assert status == 503 and error.startswith(abandoned), error
        assert seconds >= 1.3, seconds  # a load ran again (and was abandoned again)
        assert server.log().count("abandoned the load of 'slow'") == 2
        assert server.alive()
    finally:
        server.terminate()


def test_a_model_over_the_whole_budget_is_refused_with_the_reason(repo: Path) -> None:
    """Budget 12 MiB: 'big' holds 32 MiB, which its first load measures: it is unloaded and refused, and
    later requests are refused without loading it again; 'bigfiles' has 16 MiB of files and is refused
    before any load. The reason names the model, its size and the budget (before, both loaded anyway)."""
    server = start_server(repo, "--model-cache-memory-budget=12Mi", "--model-load-timeout=30", log_dir=repo.parent)
    try:
        assert _infer(server, "t0")[0] == 200  # the backend's first load (its start-up) is behind us
        for attempt in range(2):
            status, error, _ = _infer(server, "big")
            assert status == 503, error
            assert error.startswith("Request for unknown model: 'big' has no available versions: it needs "), error
            how = "measured at its load" if attempt == 0 else "measured at its last load"
            found = re.search(
                r"it needs ([0-9.]+) MiB \(" + how + r"\), more than the model cache's whole budget "
                r"of 12\.0 MiB \(--model-cache-memory-budget\)",
                error,
            )
            assert found is not None and float(found.group(1)) >= 32, error
        assert _sum(server, "kubeinfer_model_cache_loads", model="big") == 1  # refused without a second load
        row = _index(server)["big"]
        assert row["state"] == "UNAVAILABLE" and "more than the model cache's whole budget" in row["reason"], row

        status, error, _ = _infer(server, "bigfiles")
        assert status == 503, error
        assert "'bigfiles'" in error and "(estimated from its 16.0 MiB of files)" in error, error
        assert _sum(server, "kubeinfer_model_cache_loads", model="bigfiles") == 0
        assert "loaded bigfiles" not in server.log()
        assert _infer(server, "t1")[0] == 200  # the server goes on serving
    finally:
        server.terminate()


def test_a_round_robin_thrasher_hits_the_swap_limit_and_the_loaded_models_keep_answering(repo: Path) -> None:
    """Budget for two 8 MiB models, 3 swaps a minute: callers cycling through 8 models get two loads, three
    swaps, then 503 'try again' for every model not loaded; the two loaded ones stay and answer throughout,
    also while 4 threads keep thrashing."""
    server = start_server(
        repo,
        "--model-cache-memory-budget=20Mi",
        "--model-cache-swaps-per-minute=3",
        "--model-load-timeout=30",
        log_dir=repo.parent,
    )
    try:
        answers = [(name, *_infer(server, name)) for name in THRASHED * 2]
        served = [name for name, status, _, _ in answers if status == 200]
        refused = [(name, error) for name, status, error, _ in answers if status != 200]
        assert served[:5] == THRASHED[:5], answers  # two loads, then three that unloaded another
        for name, error in refused:
            assert error.startswith(f"Request for unknown model: '{name}' has no available versions: not loaded")
            assert "(--model-cache-swaps-per-minute); try again in " in error, error
        assert len(refused) >= 9, answers
        loaded = {n for n, r in _index(server).items() if r["state"] == "READY"}
        assert loaded == {"t3", "t4"}, loaded
        assert _sum(server, "kubeinfer_model_cache_evictions", reason="budget") == 3

        def steady() -> list[int]:
            return [_infer(server, name)[0] for _ in range(10) for name in ("t3", "t4")]

        def thrash(offset: int) -> list[int]:
            return [_infer(server, THRASHED[(offset + i) % len(THRASHED)])[0] for i in range(16)]

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            steady_answers = pool.submit(steady)
            thrashers = [pool.submit(thrash, k) for k in range(4)]
            assert set(steady_answers.result()) == {200}
            statuses = [s for t in thrashers for s in t.result()]
        assert set(statuses) == {200, 503} and statuses.count(503) >= 40, statuses
        assert {n for n, r in _index(server).items() if r["state"] == "READY"} == {"t3", "t4"}
        assert _sum(server, "kubeinfer_model_cache_evictions", reason="budget") == 3
        assert server.log().count("--model-cache-swaps-per-minute): requests for models not loaded") == 1
    finally:
        server.terminate()
