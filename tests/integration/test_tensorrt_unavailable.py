"""Without the tensorrt package a plan model is UNAVAILABLE with the install hint; the server serves the rest."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from tritonclient.utils import InferenceServerException

from tests.support.repos import write_model
from tests.support.server import start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None,
    reason="tensorrt is installed here: the missing-package path is not reachable (tests/gpu covers serving)",
)


def test_plan_model_without_tensorrt_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo,
        "add_sub",
        """
        name: "add_sub"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
    """,
        {1: models.add_sub(16)},
    )
    (repo / "engine" / "1").mkdir(parents=True)
    (repo / "engine" / "1" / "model.plan").write_bytes(b"not an engine")
    (repo / "engine" / "config.pbtxt").write_text(
        textwrap.dedent("""
        name: "engine"
        platform: "tensorrt_plan"
        max_batch_size: 8
        input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
        output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
    """)
    )
    server = start_server(repo, log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["engine"]["state"] == "UNAVAILABLE"
        assert "tensorrt is not installed: pip install kubeinfer[gpu]" in rows["engine"]["reason"]
        assert not client.is_model_ready("engine")
        inp = httpclient.InferInput("input", [1, 3, 32, 32], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 32, 32), dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("engine", [inp])
        assert info.value.status() == "503"
        assert "tensorrt is not installed" in info.value.message()
        assert client.is_model_ready("add_sub")
    finally:
        server.terminate()
