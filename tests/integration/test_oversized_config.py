"""A config.pbtxt of any size (a sparse file costs its writer nothing) is refused from its size, never read.

A tenant who can write a served folder (hostPath or local volumes) could plant one; the server used to read it
whole and run out of memory. Now that model is unavailable with the reason and every other model serves.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.support.drills import rss_bytes
from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import start_server

CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def test_a_sparse_50_gb_config_is_refused_and_the_rest_serve(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("good", "huge"):
        write_model(repo, name, CONFIG, {1: unary("relu", "Relu", TensorProto.FLOAT, ["batch", "n"])})
    with open(repo / "huge" / "config.pbtxt", "r+b") as f:
        f.truncate(50 << 30)  # sparse: no disk, no time
    server = start_server(repo)
    try:
        index = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=30).json()
        huge = next(row for row in index if row["name"] == "huge")
        assert huge["state"] == "UNAVAILABLE" and "config.pbtxt" in huge["reason"], huge
        assert "larger than 16777216 bytes" in huge["reason"], huge
        client = httpclient.InferenceServerClient(url=server.http_url)
        x = np.array([[1.0, -1.0]], dtype=np.float32)
        inp = httpclient.InferInput("IN", x.shape, "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("good", [inp]).as_numpy("OUT"), [[1.0, 0.0]])
        assert rss_bytes(server.proc.pid) < 1 << 30  # nothing near the file's size was read
    finally:
        assert server.terminate() == 0
    assert os.path.getsize(repo / "huge" / "config.pbtxt") == 50 << 30
