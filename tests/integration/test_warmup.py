"""Model warm-up: a version is READY only after its samples ran on every instance; a reload warms the
new version while the old one serves; warm-up runs show in the version's statistics from the start."""

from __future__ import annotations

import shutil
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

GATED_MODEL = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Doubles IN; every execution waits until the gate file exists (so warm-up can be held open)."""

    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        deadline = time.monotonic() + 300
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
            for r in requests
        ]
'''


def gated_config(gate: Path, samples: str) -> str:
    return (
        textwrap.dedent(f"""\
        name: "gated"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 3 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] }} ]
        instance_group [ {{ count: 2 kind: KIND_CPU }} ]
        parameters {{ key: "gate" value {{ string_value: "{gate}" }} }}
        """)
        + samples
    )


SAMPLES = """
model_warmup [
  { name: "zeros" batch_size: 2 count: 3 inputs { key: "IN" value { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } },
  { name: "random" batch_size: 1 inputs { key: "IN" value { data_type: TYPE_FP32 dims: [ 3 ] random_data: true } } }
]
"""


def _write_gated(repo: Path, version: int, gate: Path) -> None:
    (repo / "gated" / str(version)).mkdir(parents=True, exist_ok=True)
    (repo / "gated" / "config.pbtxt").write_text(gated_config(gate, SAMPLES))
    (repo / "gated" / str(version) / "model.py").write_text(GATED_MODEL)


def _index(server: ServerProcess) -> list[dict[str, Any]]:
    return httpx.post(f"{server.base_url}/v2/repository/index", json={}).json()


def _stats(server: ServerProcess, version: str = "") -> dict[str, Any]:
    path = f"/v2/models/gated/versions/{version}/stats" if version else "/v2/models/gated/stats"
    return httpx.get(f"{server.base_url}{path}").json()["model_stats"][0]


def test_ready_only_after_warmup_and_warmup_shows_in_statistics(tmp_path: Path) -> None:
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    _write_gated(repo, 1, gate)
    server = start_server(repo, wait=False)
    try:
        wait_for("the HTTP listener", lambda: _live(server))
        # warm-up is held by the gate: the version is loading, not ready, and takes no requests
        wait_for("the model to be loading", lambda: any(r.get("state") == "LOADING" for r in _index(server)))
        assert httpx.get(f"{server.base_url}/v2/models/gated/ready").status_code != 200
        assert httpx.get(f"{server.base_url}/v2/health/ready").status_code == 503
        gate.touch()
        wait_for(
            "the model to be ready", lambda: httpx.get(f"{server.base_url}/v2/models/gated/ready").status_code == 200
        )
        stats = _stats(server)
        # 2 instances x (3 runs of batch 2 + 1 run of batch 1), before any client request
        assert stats["execution_count"] == 8
        assert stats["inference_count"] == 2 * (3 * 2 + 1)
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 2, 2: 6}
        assert stats["inference_stats"]["success"]["count"] == 0
        client = httpclient.InferenceServerClient(server.http_url)
        x = np.array([[1, 2, 3]], dtype=np.float32)
        inp = httpclient.InferInput("IN", [1, 3], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("gated", [inp]).as_numpy("OUT"), x * 2)
        assert "warmed up gated version 1: 8 sample run(s) on 2 instance(s)" in server.log()
    finally:
        gate.touch()
        server.terminate()


def _live(server: ServerProcess) -> bool:
    try:
        return httpx.get(f"{server.base_url}/v2/health/live", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_reload_warms_the_new_version_before_it_takes_traffic(tmp_path: Path) -> None:
    repo, gate1, gate2 = tmp_path / "repo", tmp_path / "gate1", tmp_path / "gate2"
    gate1.touch()
    _write_gated(repo, 1, gate1)
    server = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=0.2")
    stop = threading.Event()
    results: list[str] = []

    def traffic() -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        x = np.ones((1, 3), dtype=np.float32)
        while not stop.is_set():
            inp = httpclient.InferInput("IN", [1, 3], "FP32")
            inp.set_data_from_numpy(x)
            try:
                r = client.infer("gated", [inp])
                results.append(r.get_response()["model_version"])
            except Exception as exc:  # recorded: the test fails on any
                results.append(f"error: {exc}")

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_for("requests served by version 1", lambda: results.count("1") >= 5)
        # version 2 arrives with the gate closed: it warms up while version 1 keeps serving
        staging = repo / "gated" / ".2.staging"
        staging.mkdir()
        (staging / "model.py").write_text(GATED_MODEL)
        config = gated_config(gate2, SAMPLES)
        (repo / "gated" / ".config.tmp").write_text(config)
        staging.rename(repo / "gated" / "2")
        (repo / "gated" / ".config.tmp").replace(repo / "gated" / "config.pbtxt")
        wait_for(
            "version 2 to be warming up",
            lambda: any(r.get("version") == "2" and r.get("state") == "LOADING" for r in _index(server)),
        )
        served_while_warming = len(results)
        wait_for("more requests served by version 1 during warm-up", lambda: len(results) >= served_while_warming + 5)
        assert "2" not in results
        gate2.touch()
        wait_for("requests served by version 2", lambda: results.count("2") >= 5)
    finally:
        stop.set()
        thread.join(60)
        gate2.touch()
        server.terminate()
    assert not [r for r in results if r.startswith("error")], [r for r in results if r.startswith("error")][:3]
    first_v2 = results.index("2")
    assert "1" not in results[first_v2:]  # the switch is atomic: no request goes back to version 1


def test_onnx_warmup_from_data_file_and_a_failing_sample(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    config = """
        name: "{name}"
        backend: "onnxruntime"
        max_batch_size: 8
        input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        model_warmup [ {{
          name: "from_file"
          batch_size: 4
          inputs {{ key: "A" value {{ data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "{file}" }} }}
          inputs {{ key: "B" value {{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true }} }}
        }} ]
    """
    model = test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])
    good = write_model(repo, "good", config.format(name="good", file="a.bin"), {1: model})
    (good / "warmup").mkdir()
    (good / "warmup" / "a.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    write_model(repo, "bad", config.format(name="bad", file="missing.bin"), {1: model})
    server = start_server(repo)
    try:
        stats = httpx.get(f"{server.base_url}/v2/models/good/stats").json()["model_stats"][0]
        # every instance warms up: an onnxruntime model without instance_group gets Triton's two CPU instances
        assert stats["execution_count"] == 2 and stats["batch_stats"][0]["batch_size"] == 4
        rows = {r["name"]: r for r in _index(server)}
        assert rows["bad"]["state"] == "UNAVAILABLE"
        assert "model_warmup 'from_file' input 'A': cannot read" in rows["bad"]["reason"]
        assert "missing.bin" in rows["bad"]["reason"]
    finally:
        server.terminate()
    shutil.rmtree(repo)
