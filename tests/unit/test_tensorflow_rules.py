"""The TensorFlow backend's rules that need no TensorFlow: parameters, Triton's dims comparison and its messages,
and how the repository scan recognises a SavedModel (a folder) as Triton's auto-complete does."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubeinfer.server.backends.tensorflow.backend import _compare_dims
from kubeinfer.server.backends.tensorflow.parameters import parse_parameters
from kubeinfer.server.backends.tensorflow.savedmodel import Tensor
from kubeinfer.server.config import ConfigError, parse_config_text, pb
from kubeinfer.server.config.platforms import model_is_folder
from kubeinfer.server.repository.scan import read_model


def _config(text: str) -> pb.ModelConfig:
    return parse_config_text('name: "m"\nplatform: "tensorflow_savedmodel"\n' + text)


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def test_parameters_default_to_tritons() -> None:
    params = parse_parameters(_config(""))
    assert (params.signature_def, params.graph_tag, params.session_share_count) == ("", "", 1)
    assert (params.intra_op_threads, params.inter_op_threads, params.per_session_threads) == (0, 0, False)
    given = parse_parameters(
        _config(
            _param("TF_SIGNATURE_DEF", "predict")
            + _param("TF_GRAPH_TAG", "serve1")
            + _param("TF_NUM_INTRA_THREADS", "2")
            + _param("TF_NUM_INTER_THREADS", "0")
            + _param("TF_USE_PER_SESSION_THREADS", "On")
            + _param("MAX_SESSION_SHARE_COUNT", "3")
        )
    )
    assert (given.signature_def, given.graph_tag, given.intra_op_threads, given.session_share_count) == (
        "predict",
        "serve1",
        2,
        3,
    )
    assert given.per_session_threads


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "MAX_SESSION_SHARE_COUNT",
            "0",
            "parameter 'MAX_SESSION_SHARE_COUNT' must be positive number for TensorFlow model 'm'",
        ),
        (
            "TF_NUM_INTRA_THREADS",
            "-1",
            "parameter 'TF_NUM_INTRA_THREADS' must be non-negative number for TensorFlow model 'm'",
        ),
        (
            "TF_NUM_INTER_THREADS",
            "two",
            "parameter 'TF_NUM_INTER_THREADS' must be non-negative number for TensorFlow model 'm'",
        ),
        (
            "TF_USE_PER_SESSION_THREADS",
            "maybe",
            "parameter 'TF_USE_PER_SESSION_THREADS' must be true or false, got 'maybe'",
        ),
    ],
)
def test_bad_parameters_are_refused_in_tritons_words(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_parameters(_config(_param(key, value)))
    assert str(info.value) == message


def test_dims_compare_as_triton_compares_them() -> None:
    x = Tensor("x", "serving_default_x:0", "TYPE_FP32", [-1, 4])
    _compare_dims("m", x, [4], batching=True, exact=False)
    _compare_dims("m", x, [-1, 4], batching=False, exact=False)
    # inputs: a variable model dim takes any config value; outputs compare exactly
    _compare_dims("m", Tensor("x", "", "TYPE_FP32", [-1, -1]), [7], batching=True, exact=False)
    with pytest.raises(ConfigError) as info:
        _compare_dims("m", Tensor("y", "", "TYPE_FP32", [-1, -1]), [7], batching=True, exact=True)
    assert str(info.value) == (
        "model 'm', tensor 'y': the model expects 2 dimensions (shape [-1,-1]) but the model configuration specifies "
        "2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
        "making complete shape [-1,7])"
    )
    with pytest.raises(ConfigError) as info:
        _compare_dims("m", Tensor("x", "", "TYPE_FP32", [2, 4]), [4], batching=True, exact=False)
    assert str(info.value) == (
        "model 'm', tensor 'x': for the model to support batching the shape should have at least 1 dimension and "
        "the first dimension must be -1; but shape expected by the model is [2,4]"
    )
    with pytest.raises(ConfigError) as info:
        _compare_dims("m", x, [4], batching=False, exact=False)
    assert str(info.value) == (
        "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,4]) but the model configuration specifies "
        "1 dimensions (shape [4])"
    )


def test_the_scan_takes_a_savedmodel_folder_and_nothing_else(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "folder" / "1" / "model.savedmodel").mkdir(parents=True)
    (repo / "file" / "1").mkdir(parents=True)
    (repo / "file" / "1" / "model.savedmodel").write_bytes(b"not a folder")
    (repo / "onnx_folder" / "1" / "model.onnx").mkdir(parents=True)
    (repo / "declared" / "1").mkdir(parents=True)
    (repo / "declared" / "1" / "model.savedmodel").write_bytes(b"not a folder")
    (repo / "declared" / "2" / "model.savedmodel").mkdir(parents=True)
    (repo / "declared" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\n')

    found = read_model(repo, "folder")
    assert found.config is not None and found.config.platform == "tensorflow_savedmodel"
    assert list(found.versions) == [1] and model_is_folder(found.config)
    # Triton: a file named model.savedmodel, or a folder named model.onnx, implies no platform
    for name in ("file", "onnx_folder"):
        source = read_model(repo, name)
        assert source.config is not None and not source.config.platform and not source.config.backend, name
    # with the platform given, only a version whose model.savedmodel is a folder counts
    assert list(read_model(repo, "declared").versions) == [2]
