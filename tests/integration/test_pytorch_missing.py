"""Without torch a PyTorch model is UNAVAILABLE with the extra to install; the server serves the rest.

Where torch is installed, the server runs with a ``torch`` package on PYTHONPATH that raises ImportError
(what Python raises when the package is absent), so this path is tested on every machine.
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from tritonclient.utils import InferenceServerException

from tests.support.repos import write_model
from tests.support.server import start_server


def test_pytorch_model_without_torch_names_the_extra(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo, "add_sub", 'name: "add_sub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n', {1: models.add_sub(16)}
    )
    (repo / "classifier" / "1").mkdir(parents=True)
    (repo / "classifier" / "1" / "model.pt").write_bytes(b"never read: the missing package is reported first")
    (repo / "classifier" / "config.pbtxt").write_text(
        textwrap.dedent("""
        name: "classifier"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
        """)
    )
    env = {}
    if importlib.util.find_spec("torch") is not None:
        hidden = tmp_path / "no_torch" / "torch"
        hidden.mkdir(parents=True)
        (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
        env["PYTHONPATH"] = str(hidden.parent)
    server = start_server(repo, log_dir=tmp_path, env=env)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["classifier"]["state"] == "UNAVAILABLE"
        assert "torch is not installed: pip install kubeinfer[pytorch]" in rows["classifier"]["reason"]
        inp = httpclient.InferInput("INPUT__0", [1, 3, 16, 16], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 16, 16), dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("classifier", [inp])
        assert info.value.status() == "503"
        assert "pip install kubeinfer[pytorch]" in info.value.message()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_model_ready("add_sub") and not grpc.is_model_ready("classifier")
        a = np.ones((1, 16), dtype=np.float32)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
    finally:
        server.terminate()
