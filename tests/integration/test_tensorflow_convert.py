"""``kubeinfer convert model.savedmodel``: a SavedModel → ONNX (tf2onnx) written as a new model version, then
served next to the SavedModel.

The converter reports the largest output difference between the ONNX model (onnxruntime) and the SavedModel
on the same inputs; this test holds it to TOLERANCE (relative to the largest output) and checks the served
ONNX model against the served SavedModel, and both against TensorFlow in this process, the same way.
TensorRT needs a GPU: tests/gpu/test_tensorflow_gpu.py.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.server import start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("tf2onnx") is None,
    reason="tensorflow and tf2onnx are not installed: pip install kubeinfer[tensorflow]",
)

if importlib.util.find_spec("tensorflow") is not None:
    from tests.support import tf_worker as tm

#: FP32 conversion: the graphs compute the same function with different kernels
TOLERANCE = 1e-4


def _convert(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "convert", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


def _differences(stdout: str) -> dict[str, float]:
    return {
        n: float(x)
        for n, x in re.findall(
            r"ONNX output '([^']+)': max abs difference [0-9.e+-]+, max rel difference ([0-9.e+-]+)", stdout
        )
    }


def test_keras_savedmodel_to_onnx_is_served_with_the_same_outputs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    source = repo / "classifier" / "1" / "model.savedmodel"
    tm.save_keras_classifier(source, seed=11)
    (repo / "classifier" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\nmax_batch_size: 16\n')

    first = _convert(str(source), "--repository", str(repo), "--name", "classifier_onnx")
    assert first.returncode == 0, first.stderr
    assert "tensor names, types and dims from" in first.stderr  # the config two folders up
    differences = _differences(first.stdout)
    assert set(differences) == {"output_0"} and max(differences.values()) < TOLERANCE, first.stdout
    assert re.search(
        r"TensorFlow \(SavedModel, CPU\) [0-9.]+ ms, onnxruntime \(CPUExecutionProvider\) [0-9.]+ ms", first.stdout
    )
    second = _convert(str(source), "--repository", str(repo), "--name", "classifier_onnx")
    assert second.returncode == 0, second.stderr
    assert "classifier_onnx/2/model.onnx (version 2)" in second.stdout  # each conversion is a new version
    config = (repo / "classifier_onnx" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and 'name: "features"' in config and 'name: "output_0"' in config
    assert "max_batch_size: 16" in config

    server = start_server(repo, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        features = np.random.default_rng(4).standard_normal((16, 8)).astype(np.float32)  # batch 16: dynamic axis
        outputs = {}
        for model in ("classifier", "classifier_onnx"):
            inp = grpcclient.InferInput("features", list(features.shape), "FP32")
            inp.set_data_from_numpy(features)
            outputs[model] = client.infer(model, [inp]).as_numpy("output_0")
        scale = np.abs(outputs["classifier"]).max()
        assert np.abs(outputs["classifier_onnx"] - outputs["classifier"]).max() <= TOLERANCE * scale
        expected = tm.reference(source, {"features": features})["output_0"]
        np.testing.assert_allclose(outputs["classifier"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outputs["classifier_onnx"], expected, rtol=TOLERANCE, atol=1e-6)
    finally:
        server.terminate()


def test_another_signature_without_a_config(tmp_path: Path) -> None:
    """A SavedModel outside any repository: its signature alone gives the config; --signature picks 'scaled'."""
    source = tmp_path / "export"
    tm.save_linear(source, seed=2)
    repo = tmp_path / "repo"
    repo.mkdir()
    done = _convert(str(source), "--repository", str(repo), "--name", "scaled_onnx", "--signature", "scaled")
    assert done.returncode == 0, done.stderr
    differences = _differences(done.stdout)
    assert set(differences) == {"z"} and max(differences.values()) < TOLERANCE, done.stdout
    server = start_server(repo, log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        x = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
        k = np.array([[1], [2], [-5]], dtype=np.int32)
        inputs = [httpclient.InferInput("x", [3, 4], "FP32"), httpclient.InferInput("k", [3, 1], "INT32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(k)
        got = client.infer("scaled_onnx", inputs).as_numpy("z")
        np.testing.assert_allclose(got, tm.reference(source, {"x": x, "k": k}, "scaled")["z"], rtol=TOLERANCE)
    finally:
        server.terminate()


def test_a_folder_that_is_no_savedmodel_or_a_missing_signature_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    source = tmp_path / "export"
    tm.save_linear(source, seed=3)
    done = _convert(str(source), "--repository", str(repo), "--name", "x_onnx", "--signature", "predict")
    assert done.returncode == 2
    assert "expected 'predict' signature (the SavedModel's signatures: scaled, serving_default)" in done.stderr
    shutil.rmtree(source / "variables")
    (source / "saved_model.pb").unlink()
    done = _convert(str(source), "--repository", str(repo), "--name", "x_onnx")
    assert done.returncode == 2, done.stderr
    assert "is not a SavedModel folder (no saved_model.pb in it)" in done.stderr
    assert not (repo / "x_onnx").exists()
