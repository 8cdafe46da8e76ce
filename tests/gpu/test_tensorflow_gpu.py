"""A TensorFlow SavedModel → ONNX → TensorRT with ``kubeinfer convert --tensorrt``, then the plan served next to
the SavedModel (CPU instances: PyPI's tensorflow-cpu has no GPU kernels)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.gpu.conftest import require
from tests.support.server import start_server


def test_savedmodel_to_tensorrt_is_served_with_the_same_outputs(tmp_path: Path, tensorrt_available: None) -> None:
    require(
        importlib.util.find_spec("tensorflow") is not None and importlib.util.find_spec("tf2onnx") is not None,
        "tensorflow and tf2onnx are not installed: pip install kubeinfer[tensorflow]",
    )
    from tests.support import tf_worker as tm

    repo = tmp_path / "repo"
    source = repo / "classifier" / "1" / "model.savedmodel"
    tm.save_keras_classifier(source, seed=5)
    (repo / "classifier" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\nmax_batch_size: 16\n')
    done = subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "convert", str(source), "--repository", str(repo),
         "--name", "classifier_onnx", "--tensorrt"],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trt = [
        float(x)
        for x in re.findall(
            r"TensorRT output '[^']+': max abs difference [0-9.e+-]+, max rel difference ([0-9.e+-]+)", done.stdout
        )
    ]
    assert trt and max(trt) < 1e-3, done.stdout  # FP32 (TF32 kernels allowed)
    assert (repo / "classifier_onnx_trt" / "1" / "model.plan").is_file()
    server = start_server(repo, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        features = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
        inp = grpcclient.InferInput("features", list(features.shape), "FP32")
        inp.set_data_from_numpy(features)
        reference = client.infer("classifier", [inp]).as_numpy("output_0")
        plan = client.infer("classifier_onnx_trt", [inp]).as_numpy("output_0")
        assert np.abs(plan - reference).max() <= 1e-3 * np.abs(reference).max()
    finally:
        server.terminate()
