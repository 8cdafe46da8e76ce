"""``kubeinfer convert model.pt``: TorchScript → ONNX written as a new model version, then served.

The converter reports the largest output difference between the ONNX model (onnxruntime) and the
TorchScript module on the same inputs; this test holds it to TOLERANCE (relative to the largest
output) and checks the served ONNX model against the served TorchScript model the same way.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.server import start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed: pip install kubeinfer[pytorch]"
)

if importlib.util.find_spec("torch") is not None:
    import torch

    from tests.support import torch_models as tm

#: FP32 export: the graphs compute the same function with different kernels
TOLERANCE = 1e-4
CONFIG = """
name: "resnet_classifier"
platform: "pytorch_libtorch"
max_batch_size: 16
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { }
"""


def _convert(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "convert", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _differences(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"max rel difference ([0-9.e+-]+)", stdout)]


def test_torchscript_to_onnx_is_served_with_the_same_outputs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    source = repo / "resnet_classifier" / "1" / "model.pt"
    tm.save_torchscript(tm.classifier(5), source)
    (repo / "resnet_classifier" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))

    first = _convert(str(source), "--repository", str(repo), "--name", "resnet_onnx")
    assert first.returncode == 0, first.stderr
    assert "tensor names, types and dims from" in first.stderr  # the config two folders up
    differences = _differences(first.stdout)
    assert differences and max(differences) < TOLERANCE, first.stdout
    assert re.search(
        r"PyTorch \(TorchScript, CPU\) [0-9.]+ ms, onnxruntime \(CPUExecutionProvider\) [0-9.]+ ms", first.stdout
    )
    second = _convert(str(source), "--repository", str(repo), "--name", "resnet_onnx")
    assert second.returncode == 0, second.stderr
    assert "resnet_onnx/2/model.onnx (version 2)" in second.stdout  # each conversion is a new version
    config = (repo / "resnet_onnx" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and 'name: "INPUT__0"' in config and "dynamic_batching" in config

    server = start_server(repo, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        images = np.random.default_rng(9).standard_normal((16, 3, 16, 16)).astype(np.float32)  # batch 16: dynamic axis
        outputs = {}
        for model in ("resnet_classifier", "resnet_onnx"):
            inp = grpcclient.InferInput("INPUT__0", list(images.shape), "FP32")
            inp.set_data_from_numpy(images)
            outputs[model] = client.infer(model, [inp]).as_numpy("OUTPUT__0")
        scale = np.abs(outputs["resnet_classifier"]).max()
        assert np.abs(outputs["resnet_onnx"] - outputs["resnet_classifier"]).max() <= TOLERANCE * scale
        np.testing.assert_allclose(
            outputs["resnet_classifier"], tm.run(tm.classifier(5), images)[0], rtol=1e-5, atol=1e-5
        )
    finally:
        server.terminate()


def test_exported_program_without_config_uses_the_input_shape(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    source = tm.save_exported(tm.Pair(), (torch.zeros(2, 3), torch.zeros(2, 3)), tmp_path / "pair.pt2", max_batch=8)
    done = _convert(
        str(source),
        "--repository",
        str(repo),
        "--name",
        "pair_onnx",
        "--input-shape",
        "a=3",
        "--input-shape",
        "b=3",
        "--max-batch",
        "8",
    )
    assert done.returncode == 0, done.stderr
    differences = _differences(done.stdout)
    assert len(differences) == 3 and max(differences) < TOLERANCE, done.stdout
    config = (repo / "pair_onnx" / "config.pbtxt").read_text()
    for name in ("INPUT__0", "INPUT__1", "OUTPUT__0", "OUTPUT__1", "OUTPUT__2"):
        assert f'name: "{name}"' in config


def test_a_model_without_config_or_shapes_is_refused_with_what_to_give(tmp_path: Path) -> None:
    source = tm.save_torchscript(tm.classifier(1), tmp_path / "model.pt")
    (tmp_path / "repo").mkdir()
    done = _convert(str(source), "--repository", str(tmp_path / "repo"), "--name", "x_onnx")
    assert done.returncode == 2
    assert "--input-shape INPUT__0=3x224x224 (forward takes x)" in done.stderr
    assert not (tmp_path / "repo" / "x_onnx").exists()
