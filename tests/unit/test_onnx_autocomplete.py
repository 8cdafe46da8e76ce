"""Auto-complete and model/config consistency checks for ONNX models (Triton without strict config)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from kubeinfer.server.backends.onnxruntime import OnnxRuntimeBackend
from kubeinfer.server.config import ConfigError, parse_config_text, pb
from kubeinfer.server.examples import models


def _version(tmp_path: Path, model: onnx.ModelProto) -> Path:
    vdir = tmp_path / "1"
    vdir.mkdir()
    onnx.save(model, str(vdir / "model.onnx"))
    return vdir


def test_minimal_config_is_filled_from_the_graph(tmp_path: Path) -> None:
    vdir = _version(tmp_path, models.add_sub(16))
    config = parse_config_text('platform: "onnxruntime_onnx"')
    OnnxRuntimeBackend.auto_complete_config(config, vdir)
    assert config.max_batch_size == 4  # Triton's default-max-batch-size
    assert config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims), t.data_type) for t in config.input] == [
        ("INPUT0", [16], pb.TYPE_FP32),
        ("INPUT1", [16], pb.TYPE_FP32),
    ]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]
    OnnxRuntimeBackend.validate_model(config, vdir)


def test_non_batching_graph_gets_max_batch_size_zero(tmp_path: Path) -> None:
    vdir = _version(tmp_path, models.add_sub(4, batched=False))
    config = parse_config_text('platform: "onnxruntime_onnx"')
    OnnxRuntimeBackend.auto_complete_config(config, vdir)
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [4]


def test_explicit_zero_is_kept(tmp_path: Path) -> None:
    vdir = _version(tmp_path, models.add_sub(16))
    config = parse_config_text('platform: "onnxruntime_onnx" max_batch_size: 0')
    OnnxRuntimeBackend.auto_complete_config(config, vdir)
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, 16]


@pytest.mark.parametrize(
    ("config_text", "message"),
    [
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]',
            r"input 'INPUT0' has dims \[3, 32, 32\] in the config but \[16\] \(without the batch dimension\)",
        ),
        (
            'max_batch_size: 8 input [ { name: "INPUT9" data_type: TYPE_FP32 dims: [ 16 ] } ]',
            "input 'INPUT9' is not in the ONNX model; the model's inputs are INPUT0, INPUT1",
        ),
        (
            'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]',
            "input 'INPUT0' is TYPE_FP32 in the ONNX model but TYPE_INT32 in the config",
        ),
    ],
)
def test_config_contradicting_the_graph_is_refused(tmp_path: Path, config_text: str, message: str) -> None:
    vdir = _version(tmp_path, models.add_sub(16))
    config = parse_config_text('platform: "onnxruntime_onnx" ' + config_text)
    with pytest.raises(ConfigError, match=message):
        OnnxRuntimeBackend.validate_model(config, vdir)


def test_corrupt_file_gives_a_readable_error(tmp_path: Path) -> None:
    vdir = tmp_path / "1"
    vdir.mkdir()
    (vdir / "model.onnx").write_bytes(b"this is not a protobuf")
    with pytest.raises(ConfigError, match="cannot read ONNX model model.onnx"):
        OnnxRuntimeBackend.auto_complete_config(parse_config_text('platform: "onnxruntime_onnx"'), vdir)
