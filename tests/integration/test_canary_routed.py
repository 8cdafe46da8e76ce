"""The canary's numbers count only the requests the traffic weights routed (issue 37), on a real server.

The operator judges a canary by each version's statistics (``operator/traffic/rollout.py``). Triton's counts of a
row also hold callers that name the version (``/v2/models/m/versions/2/infer``), who are outside the
weighted split: a burst of their failing (or fast) requests would roll a healthy canary back (or promote a
slow one). The server keeps the routed requests' counts and latency histogram apart, in the HTTP row's
``kubeinfer_routed`` field; requests that name a version leave it as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from kubeinfer.server.vocabulary.statistics import LATENCY_KEY, ROUTED_KEY
from onnx import TensorProto

from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

CONFIG = """name: "canary"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { all { } }
instance_group [{ count: 1 kind: KIND_CPU }]
parameters { key: "kubeinfer.version_traffic" value { string_value: "1:50,2:50" } }
"""
GOOD = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
#: a shape the model does not take: refused by the version it reached, a failure in its statistics
BAD = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("canary_routed") / "repo"
    model = unary("canary", "Identity", TensorProto.FLOAT, ["batch", 4])
    write_model(repo, "canary", CONFIG, {1: model, 2: model})
    server = start_server(repo, log_dir=repo.parent)
    yield server
    server.terminate()


def _rows(server: ServerProcess) -> dict[str, dict[str, Any]]:
    rows = httpx.get(f"{server.base_url}/v2/models/canary/stats", timeout=10).json()["model_stats"]
    return {r["version"]: r for r in rows}


def _counts(row: dict[str, Any]) -> tuple[int, int, int, int]:
    """(Triton's successes, Triton's failures, routed successes, routed failures) of one row."""
    stats, routed = row["inference_stats"], row.get(ROUTED_KEY) or {}
    return (
        stats["success"]["count"],
        stats["fail"]["count"],
        (routed.get("success") or {}).get("count", 0),
        (routed.get("fail") or {}).get("count", 0),
    )


def _post(client: httpx.Client, path: str, body: dict[str, Any], n: int, status: int) -> list[str]:
    versions = []
    for _ in range(n):
        r = client.post(path, json=body)
        assert r.status_code == status, r.text
        if status == 200:
            versions.append(r.json()["model_version"])
    return versions


def test_pinned_requests_leave_the_routed_numbers_alone(server: ServerProcess) -> None:
    before = {v: _counts(r) for v, r in _rows(server).items()}
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        assert set(_post(client, "/v2/models/canary/versions/2/infer", GOOD, 30, 200)) == {"2"}
        _post(client, "/v2/models/canary/versions/2/infer", BAD, 20, 400)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("IN", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        for _ in range(10):
            assert grpc.infer("canary", [x], model_version="2").get_response().model_version == "2"
        grpc_rows = grpc.get_inference_statistics("canary", as_json=True)["model_stats"]
    finally:
        grpc.close()
    after = {v: _counts(r) for v, r in _rows(server).items()}
    # Triton's counts of version 2 took all 60 (its fields unchanged), the routed numbers none
    assert after["2"][:2] == (before["2"][0] + 40, before["2"][1] + 20)
    assert after["2"][2:] == before["2"][2:] and after["1"] == before["1"]
    assert all(ROUTED_KEY not in r for r in grpc_rows)  # gRPC keeps Triton's message


def test_unpinned_requests_are_counted_as_routed(server: ServerProcess) -> None:
    before = {v: _counts(r) for v, r in _rows(server).items()}
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        seen = _post(client, "/v2/models/canary/infer", GOOD, 200, 200)
        _post(client, "/v2/models/canary/infer", BAD, 40, 400)  # failures of whichever version drew them
    rows = _rows(server)
    after = {v: _counts(r) for v, r in rows.items()}
    for v in ("1", "2"):
        grown = [a - b for a, b in zip(after[v], before[v], strict=True)]
        # each routed request is in Triton's counts and in the routed ones, once
        assert grown[0] == grown[2] == seen.count(v) > 0 and grown[1] == grown[3]
        routed = rows[v][ROUTED_KEY]
        hist = routed[LATENCY_KEY]
        assert len(hist["counts"]) == len(hist["bounds_us"]) + 1
        assert sum(hist["counts"]) == routed["success"]["count"] + routed["fail"]["count"]
    assert sum(after[v][3] - before[v][3] for v in ("1", "2")) == 40
