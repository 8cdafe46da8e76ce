"""One parser for Triton's string parameters: the same mistake gets the same words from every backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubeinfer.server.backends.pytorch.parameters import parse_parameters as torch_parameters
from kubeinfer.server.backends.tensorflow.parameters import parse_parameters as tf_parameters
from kubeinfer.server.config import ConfigError, parse_config_text, pb


def _config(key: str, value: str) -> pb.ModelConfig:
    return parse_config_text(f'name: "m" parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')


@pytest.mark.parametrize("value", ["maybe", "2", "tru"])
def test_a_bad_boolean_is_refused_in_the_same_words(value: str) -> None:
    with pytest.raises(ConfigError) as torch_error:
        torch_parameters(_config("INFERENCE_MODE", value))
    with pytest.raises(ConfigError) as tf_error:
        tf_parameters(_config("TF_USE_PER_SESSION_THREADS", value))
    assert str(torch_error.value) == f"parameter 'INFERENCE_MODE' must be true or false, got '{value}'"
    assert str(tf_error.value) == f"parameter 'TF_USE_PER_SESSION_THREADS' must be true or false, got '{value}'"


@pytest.mark.parametrize("value", [" On ", "YES", "1", "true"])
def test_every_true_spelling_means_true_in_both(value: str) -> None:
    assert torch_parameters(_config("ENABLE_CACHE_CLEANING", value)).cache_cleaning is True
    assert tf_parameters(_config("TF_USE_PER_SESSION_THREADS", value)).per_session_threads is True


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_a_bad_count_is_refused_in_the_same_words(value: str) -> None:
    with pytest.raises(ConfigError) as torch_error:
        torch_parameters(_config("INTRA_OP_THREAD_COUNT", value))
    with pytest.raises(ConfigError) as tf_error:
        tf_parameters(_config("MAX_SESSION_SHARE_COUNT", value))
    assert str(torch_error.value) == "parameter 'INTRA_OP_THREAD_COUNT' must be positive number for PyTorch model 'm'"
    assert str(tf_error.value) == "parameter 'MAX_SESSION_SHARE_COUNT' must be positive number for TensorFlow model 'm'"


def test_an_empty_value_is_unset_in_both() -> None:
    assert torch_parameters(_config("INFERENCE_MODE", "")).inference_mode is True
    assert tf_parameters(_config("TF_NUM_INTRA_THREADS", "")).intra_op_threads == 0


def test_onnxruntime_thread_counts_are_parsed_by_the_same_parser() -> None:
    from kubeinfer.server.backends.base import InstanceSpec
    from kubeinfer.server.backends.onnxruntime import session_options_and_providers

    spec = InstanceSpec(name="m", kind="CPU", device_id=0, index=0, total=1, instance_name="m_0")
    opts, _ = session_options_and_providers(_config("intra_op_thread_count", " 3 "), spec, Path("/nonexistent"))
    assert opts.intra_op_num_threads == 3
    with pytest.raises(ConfigError) as error:
        session_options_and_providers(_config("inter_op_thread_count", "-1"), spec, Path("/nonexistent"))
    assert (
        str(error.value) == "parameter 'inter_op_thread_count' must be non-negative number for ONNX Runtime model 'm'"
    )
