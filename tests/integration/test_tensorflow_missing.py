"""Without tensorflow a SavedModel is UNAVAILABLE with the extra to install; the server serves the rest.

Where tensorflow is installed, the server runs with a ``tensorflow`` package on PYTHONPATH that raises
ImportError (what Python raises when the package is absent), so this path is tested on every machine.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from tritonclient.utils import InferenceServerException

from tests.support.repos import write_model
from tests.support.server import start_server


def test_savedmodel_without_tensorflow_names_the_extra(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo, "add_sub", 'name: "add_sub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n', {1: models.add_sub(16)}
    )
    saved = repo / "classifier" / "1" / "model.savedmodel"
    saved.mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"never read: the missing package is reported first")
    # no config.pbtxt: the folder's kind alone makes it a TensorFlow model
    env = {}
    if importlib.util.find_spec("tensorflow") is not None:
        hidden = tmp_path / "no_tensorflow" / "tensorflow"
        hidden.mkdir(parents=True)
        (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'tensorflow'\")\n")
        env["PYTHONPATH"] = str(hidden.parent)
    server = start_server(repo, log_dir=tmp_path, env=env)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["classifier"]["state"] == "UNAVAILABLE"
        assert "tensorflow is not installed: pip install kubeinfer[tensorflow]" in rows["classifier"]["reason"]
        inp = httpclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("classifier", [inp])
        assert info.value.status() == "503"
        assert "pip install kubeinfer[tensorflow]" in info.value.message()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_model_ready("add_sub") and not grpc.is_model_ready("classifier")
        index = {m.name: m for m in grpc.get_model_repository_index().models}
        assert "pip install kubeinfer[tensorflow]" in index["classifier"].reason
        a = np.ones((1, 16), dtype=np.float32)
        inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
    finally:
        server.terminate()
