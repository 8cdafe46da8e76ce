"""Config ``reshape`` as Triton core applies it (``runtime.reshape``) and validates it (``config.validate``)."""

from __future__ import annotations

import numpy as np
import pytest
from kubeinfer.server.config import ConfigError, parse_config_text, validate_config
from kubeinfer.server.runtime.reshape import Reshaper, reshaped
from kubeinfer.server.vocabulary.errors import BackendError


@pytest.mark.parametrize(
    ("shape", "source", "target", "batching", "expected"),
    [
        ([3, 4], [4], [2, 2], True, [3, 2, 2]),  # the batch dimension stays in front
        ([3, 2, 2], [2, 2], [4], True, [3, 4]),
        ([4], [4], [2, 2], False, [2, 2]),
        ([5, 1], [1], [], True, [5]),  # a [batch] tensor: dims [1], empty reshape
        ([5], [], [1], True, [5, 1]),
        ([2, 4, 7, 6], [2, 4, -1, 6], [8, -1, 1, 6], False, [8, 7, 1, 6]),  # Triton's example: -1 carried over
        ([1, 3, 5], [-1, -1], [-1, 1, -1], True, [1, 3, 1, 5]),  # several -1, in order
    ],
)
def test_reshaped_follows_tritons_rule(
    shape: list[int], source: list[int], target: list[int], batching: bool, expected: list[int]
) -> None:
    assert reshaped(shape, source, target, batching) == expected


def test_reshaped_refuses_another_rank() -> None:
    with pytest.raises(ValueError, match="rank"):
        reshaped([3, 2, 2], [4], [2, 2], True)


CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
"""


def test_the_reshaper_turns_clients_shapes_into_the_models_and_back() -> None:
    r = Reshaper(parse_config_text(CONFIG))
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    to_model = r.model_inputs({"IN": x})["IN"]
    assert to_model.shape == (3, 4) and np.shares_memory(to_model, x)
    back = r.client_outputs({"OUT": to_model})["OUT"]
    np.testing.assert_array_equal(back, x)
    with pytest.raises(BackendError, match=r"returned output 'OUT' with shape \[3, 5\].*says \[-1, 4\]"):
        r.client_outputs({"OUT": np.zeros((3, 5), np.float32)})
    assert not Reshaper(parse_config_text('name: "m" input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]'))


def _validate(tensor: str, max_batch_size: int = 8) -> None:
    text = f'platform: "onnxruntime_onnx" max_batch_size: {max_batch_size} {tensor}'
    validate_config(parse_config_text(text), "mymodel")


@pytest.mark.parametrize(
    ("tensor", "max_batch_size", "message"),
    [
        (
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 5 ] } } ]',
            8,
            "model output has different size for dims and reshape: output 'y' has dims [2, 2] and reshape [5]",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3 ] } } ]',
            8,
            "model input has different size for dims and reshape: input 'x'",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]',
            0,
            "model input cannot have empty reshape for non-batching model",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 0 ] } } ]',
            8,
            "model input reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ 4 ] } } ]',
            8,
            "model input has different size for dims and reshape",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 2 ] reshape: { shape: [ -1, -1 ] } } ]',
            8,
            "model input has different number of variable-size dimensions for dims and reshape",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape: { shape: [ -1, 2 ] } } ]',
            8,
            "model input has different size for dims and reshape",
        ),
    ],
)
def test_impossible_reshapes_are_refused_in_tritons_words(tensor: str, max_batch_size: int, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _validate(tensor, max_batch_size)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    "tensor",
    [
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape: { shape: [ 8, -1, 1, 6 ] } } ]',
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]',  # batching: a [batch]
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]',
    ],
)
def test_possible_reshapes_pass(tensor: str) -> None:
    _validate(tensor)


def test_warm_up_samples_reach_the_model_reshaped_as_requests_do() -> None:
    from kubeinfer.server.runtime.warmup import warmup_requests

    config = parse_config_text(
        CONFIG
        + 'model_warmup [ { name: "s" batch_size: 3 inputs { key: "IN" value: '
        + "{ data_type: TYPE_FP32 dims: [ 2, 2 ] zero_data: true } } } ]"
    )
    ((name, _, request),) = warmup_requests(config, None)
    assert name == "s" and request.inputs["IN"].shape == (3, 4)
