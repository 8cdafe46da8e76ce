"""Triton's PyTorch naming rules, parameters and file-format detection (pure functions, no torch needed)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from kubeinfer.server.backends.pytorch import artifact, naming
from kubeinfer.server.backends.pytorch.parameters import parse_parameters
from kubeinfer.server.config import ConfigError, parse_config_text


def test_named_index_splits_at_the_first_double_underscore() -> None:
    assert naming.named_index("INPUT__0") == 0
    assert naming.named_index("x__12") == 12
    assert naming.named_index("INPUT0") is None
    assert naming.named_index("a__b__1") is None  # Triton reads "b__1" after the first "__": not an index
    assert naming.named_index("INPUT__") is None


def test_inputs_prefer_argument_names_then_indices_then_config_order() -> None:
    by_name = naming.bind_inputs("m", ["scale", "image"], ["image", "scale"])
    assert by_name.convention == naming.FORWARD_ARGUMENT and by_name.positions == {"image": 0, "scale": 1}
    by_index = naming.bind_inputs("m", ["B__1", "A__0"], ["x", "y"])
    assert by_index.convention == naming.NAMED_INDEX and by_index.ordered() == ["A__0", "B__1"]
    ordered = naming.bind_inputs("m", ["second", "first"], ["x", "y"])
    assert ordered.convention == naming.CONFIG_ORDER and ordered.positions == {"second": 0, "first": 1}
    as_dict = naming.bind_inputs("m", ["left", "right", "extra"], ["inputs"], dict_input=True)
    assert as_dict.convention == naming.DICT_KEY


def test_input_errors_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match=r"configuration expects 1 inputs, model provides 2: forward\(x, y\)"):
        naming.bind_inputs("m", ["INPUT__0"], ["x", "y"])
    with pytest.raises(ConfigError, match=r"'INPUT__2' refers to input index 2, but forward\(x, y\) takes 2 inputs"):
        naming.bind_inputs("m", ["INPUT__0", "INPUT__2"], ["x", "y"])
    with pytest.raises(ConfigError, match=r"inputs 'A__1' and 'B__1' both refer to input index 1"):
        naming.bind_inputs("m", ["A__1", "B__1"], ["x", "y"])
    with pytest.raises(ConfigError, match="at least one input, none were specified"):
        naming.bind_inputs("m", [], ["x"])


def test_outputs_bind_by_index_or_config_order_and_respect_the_result_count() -> None:
    assert naming.bind_outputs("m", ["B__1", "A__0"], 2).positions == {"B__1": 1, "A__0": 0}
    assert naming.bind_outputs("m", ["sum", "diff"]).positions == {"sum": 0, "diff": 1}
    with pytest.raises(
        ConfigError, match=r"output 'OUT__1' refers to output index 1, but forward\(\) returns 1 output;"
    ):
        naming.bind_outputs("m", ["OUT__1"], 1)
    with pytest.raises(ConfigError, match="at least one output"):
        naming.bind_outputs("m", [], 1)


def test_parameters_follow_triton_defaults_and_refuse_bad_values() -> None:
    defaults = parse_parameters(parse_config_text(""))
    assert defaults.inference_mode and defaults.optimized_execution and not defaults.weight_sharing
    assert defaults.intra_op_threads is None and defaults.jit_executor is None
    config = parse_config_text(
        """
        parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } }
        parameters { key: "INFERENCE_MODE" value { string_value: "False" } }
        parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "3" } }
        parameters { key: "ENABLE_JIT_PROFILING" value { string_value: "off" } }
        parameters { key: "DISABLE_CUDNN" value { string_value: "1" } }
        parameters { key: "SOMETHING_ELSE" value { string_value: "ignored" } }
        """
    )
    p = parse_parameters(config)
    assert not p.optimized_execution and not p.inference_mode and p.intra_op_threads == 3
    assert p.jit_profiling is False and p.cudnn is False
    for key, value, message in (
        ("INTRA_OP_THREAD_COUNT", "0", "parameter 'INTRA_OP_THREAD_COUNT' must be positive number for PyTorch model"),
        ("INTER_OP_THREAD_COUNT", "two", "parameter 'INTER_OP_THREAD_COUNT' must be positive number for PyTorch"),
        ("ENABLE_WEIGHT_SHARING", "sure", "parameter 'ENABLE_WEIGHT_SHARING' must be true or false, got 'sure'"),
    ):
        bad = parse_config_text(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
        with pytest.raises(ConfigError, match=message):
            parse_parameters(bad)


def _archive(path: Path, members: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for m in members:
            z.writestr(m, b"")
    return path


def test_format_is_read_from_the_archive_not_the_name(tmp_path: Path) -> None:
    script = _archive(tmp_path / "model.pt2", ["m/data.pkl", "m/code/__torch__.py", "m/constants.pkl"])
    assert artifact.detect_format(script) == artifact.TORCHSCRIPT
    exported = _archive(tmp_path / "model.pt", ["m/archive_format", "m/models/model.json", "m/byteorder"])
    assert artifact.detect_format(exported) == artifact.EXPORTED
    with pytest.raises(ConfigError, match=r"written by torch.save\(\)"):
        artifact.detect_format(_archive(tmp_path / "pickled.pt", ["archive/data.pkl", "archive/data/0"]))
    with pytest.raises(ConfigError, match="AOTInductor package"):
        artifact.detect_format(_archive(tmp_path / "aoti.pt2", ["m/archive_format", "m/data/aotinductor/model/x.so"]))
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(ConfigError, match="is not a PyTorch archive"):
        artifact.detect_format(tmp_path / "text.pt")
    with pytest.raises(ConfigError, match="model file 'absent.pt' not found"):
        artifact.detect_format(tmp_path / "absent.pt")
