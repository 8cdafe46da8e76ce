"""Canary between versions in the server: traffic weights in config.pbtxt ``parameters``, real processes.

A model with versions 1 and 2 (``version_policy: all``) and ``kubeinfer.version_traffic: "1:90,2:10"``:
1,000 requests that name no version split 90/10 within ±5 points (HTTP; 200 more over gRPC); a request
that names a version gets it; new weights written into config.pbtxt (poll mode) move the split without
reloading either version; a bad value leaves the old weights serving, with the reason in the index.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from kubeinfer.server.repository.layout import config_digest
from onnx import TensorProto

from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONFIG = """name: "canary"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: {{ all {{ }} }}
instance_group [{{ count: 1 kind: KIND_CPU }}]
parameters {{ key: "kubeinfer.version_traffic" value {{ string_value: "{traffic}" }} }}
"""
BODY = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}


def _write_config(repo: Path, traffic: str) -> str:
    """Replace config.pbtxt atomically (the writers' contract); returns its digest."""
    text = CONFIG.format(traffic=traffic)
    tmp = repo / "canary" / ".config.pbtxt.tmp"
    tmp.write_text(text)
    os.replace(tmp, repo / "canary" / "config.pbtxt")
    return config_digest(text.encode())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repo = tmp_path_factory.mktemp("canary") / "repo"
    model = unary("canary", "Identity", TensorProto.FLOAT, ["batch", 4])
    write_model(repo, "canary", CONFIG.format(traffic="1:90,2:10"), {1: model, 2: model})
    server = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=0.5", log_dir=repo.parent)
    yield server, repo
    server.terminate()


def _versions(server: ServerProcess, n: int, version: str = "") -> collections.Counter[str]:
    path = f"/v2/models/canary/versions/{version}/infer" if version else "/v2/models/canary/infer"

    def some(count: int) -> list[str]:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            answers = []
            for _ in range(count):
                r = client.post(path, json=BODY)
                r.raise_for_status()
                assert r.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
                answers.append(r.json()["model_version"])
            return answers

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return collections.Counter(v for part in pool.map(some, [n // 4] * 4) for v in part)


def _loads(server: ServerProcess) -> int:
    return server.log().count("loaded canary version")


def test_a_90_10_split_over_1000_requests(server: tuple[ServerProcess, Path]) -> None:
    proc, _ = server
    seen = _versions(proc, 1000)
    share = seen["2"] / 1000
    print(f"\n[canary] 1:90,2:10 over 1000 HTTP requests: version 1 {seen['1']}, version 2 {seen['2']}")
    assert seen["1"] + seen["2"] == 1000
    assert 0.05 <= share <= 0.15, seen


def test_statistics_carry_each_versions_latency_histogram(server: tuple[ServerProcess, Path]) -> None:
    """HTTP rows add kubeinfer_request_duration_us (the operator's p99); gRPC keeps Triton's message."""
    proc, _ = server
    rows = httpx.get(f"{proc.base_url}/v2/models/canary/stats", timeout=10).json()["model_stats"]
    for row in rows:
        hist = row["kubeinfer_request_duration_us"]
        assert len(hist["counts"]) == len(hist["bounds_us"]) + 1
        stats = row["inference_stats"]
        assert sum(hist["counts"]) == stats["success"]["count"] + stats["fail"]["count"] > 0
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    try:
        grpc_rows = client.get_inference_statistics("canary", as_json=True)["model_stats"]
    finally:
        client.close()
    assert len(grpc_rows) == 2 and all("kubeinfer_request_duration_us" not in r for r in grpc_rows)


def test_the_split_holds_over_grpc(server: tuple[ServerProcess, Path]) -> None:
    proc, _ = server
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    try:
        x = grpcclient.InferInput("IN", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        seen = collections.Counter(client.infer("canary", [x]).get_response().model_version for _ in range(400))
    finally:
        client.close()
    assert 0.02 <= seen["2"] / 400 <= 0.2, seen  # ±8 points for 400 requests: over 5 standard deviations


def test_a_named_version_gets_that_version(server: tuple[ServerProcess, Path]) -> None:
    proc, _ = server
    assert _versions(proc, 100, version="2") == {"2": 100}
    assert _versions(proc, 100, version="1") == {"1": 100}


def test_new_weights_move_the_split_without_a_reload(server: tuple[ServerProcess, Path]) -> None:
    proc, repo = server
    loads = _loads(proc)
    digest = _write_config(repo, "1:50,2:50")

    def picked_up() -> bool:
        rows = httpx.post(f"{proc.base_url}/v2/repository/index", timeout=10).json()
        return all(r.get("config_digest") == digest for r in rows if r["name"] == "canary")

    wait_for("the new weights served", picked_up, 30)
    assert _loads(proc) == loads  # neither version was loaded again
    seen = _versions(proc, 1000)
    assert 0.45 <= seen["2"] / 1000 <= 0.55, seen
    digest = _write_config(repo, "1:0,2:100")  # promoted: every unnamed request to version 2
    wait_for("version 2 takes all", picked_up, 30)
    assert _versions(proc, 200) == {"2": 200}
    assert _versions(proc, 20, version="1") == {"1": 20}  # still loaded, still reachable by name


def test_a_bad_value_keeps_the_old_weights(server: tuple[ServerProcess, Path]) -> None:
    proc, repo = server
    _write_config(repo, "1:90,2:10")
    wait_for("90/10 again", lambda: 0.05 <= _versions(proc, 200)["2"] / 200 <= 0.2, 30)
    _write_config(repo, "1:ninety")

    def refused() -> bool:
        rows = httpx.post(f"{proc.base_url}/v2/repository/index", timeout=10).json()
        return any("kubeinfer.version_traffic" in r.get("reason", "") for r in rows)

    wait_for("the bad weights refused", refused, 30)
    rows = [r for r in httpx.post(f"{proc.base_url}/v2/repository/index", timeout=10).json() if r["name"] == "canary"]
    assert {r["state"] for r in rows} == {"READY"} and all(r["reason"].startswith("reload failed") for r in rows)
    seen = _versions(proc, 400)
    assert 0.03 <= seen["2"] / 400 <= 0.2, seen  # still 90/10
