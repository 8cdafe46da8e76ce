"""``kubeinfer_model_load_failures`` on a real server: present at 0 for a version that loaded (so a query or a
dashboard panel over it has a series before anything fails), and counting each failed load of a version."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import require_sleep_backend, write_sleep_model

FAMILY = "kubeinfer_model_load_failures"
BROKEN_CONFIG = """
name: "broken"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def load_failures(server: ServerProcess) -> dict[tuple[str, str], float]:
    """(model, version) → the family's value, from the exposition text (its TYPE line says counter)."""
    text = httpx.get(server.metrics_url, timeout=10).text
    assert f"# TYPE {FAMILY} counter" in text
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith(FAMILY + "{"):
            labels, value = line[len(FAMILY) + 1 :].rsplit("} ", 1)
            pairs = dict(pair.split("=", 1) for pair in labels.split(","))
            found[(pairs["model"].strip('"'), pairs["version"].strip('"'))] = float(value)
    return found


def test_load_failures_start_at_zero_and_count_failed_loads(tmp_path: Path) -> None:
    require_sleep_backend()
    repo = tmp_path / "repo"
    write_sleep_model(repo, "good", 0)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(BROKEN_CONFIG)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an ONNX model")
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "good", log_dir=tmp_path)
    try:
        assert load_failures(server) == {("good", "1"): 0.0}
        for attempt in (1, 2):
            refused = httpx.post(f"{server.base_url}/v2/repository/models/broken/load", timeout=60)
            assert refused.status_code == 400, refused.text
            assert load_failures(server) == {("good", "1"): 0.0, ("broken", "1"): float(attempt)}
        assert httpx.get(f"{server.base_url}/v2/models/good/ready", timeout=10).status_code == 200
    finally:
        server.terminate()
