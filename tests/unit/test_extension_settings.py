"""Command-line parsing of Triton's --trace-config / --cache-config, and sequence_batching checks."""

from __future__ import annotations

import pytest
from kubeinfer.server import cli
from kubeinfer.server.config import ConfigError, parse_config_text, validate_config
from kubeinfer.server.observability.trace import Tracer, parse_trace_config
from kubeinfer.server.runtime.cache import parse_cache_config
from kubeinfer.server.vocabulary.errors import InvalidArgument


def test_trace_config_as_triton_documents_it() -> None:
    assert parse_trace_config(
        [
            "triton,file=/tmp/t.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "level=TENSORS",
            "count=100",
        ]
    ) == {
        "trace_file": "/tmp/t.json",
        "log_frequency": "50",
        "trace_rate": "100",
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_count": "100",
    }
    with pytest.raises(ValueError, match="trace_mode 'zipkin' is not supported"):
        parse_trace_config(["mode=zipkin"])
    with pytest.raises(ValueError, match="'trace_rate' must be at least 1"):
        parse_trace_config(["rate=0"])


def test_deprecated_trace_flags_map_to_trace_config(tmp_path) -> None:
    args = cli.build_parser(triton=True).parse_args(
        [f"--model-store={tmp_path}", "--trace-file=/tmp/x.json", "--trace-level=TIMESTAMPS", "--trace-rate=5"]
    )
    settings = cli.settings_from_args(args, triton=True)
    assert settings.trace_settings == {"trace_file": "/tmp/x.json", "trace_level": ["TIMESTAMPS"], "trace_rate": "5"}


def test_cache_config() -> None:
    assert parse_cache_config(["local,size=1048576"]) == 1048576
    assert parse_cache_config([]) == 0
    with pytest.raises(ValueError, match="only the 'local' cache is implemented"):
        parse_cache_config(["redis,host=localhost"])
    with pytest.raises(ValueError, match="size=<bytes>"):
        parse_cache_config(["local,capacity=10"])


def test_trace_sampling_rate_and_count() -> None:
    tracer = Tracer({"trace_level": ["TIMESTAMPS"], "trace_rate": "3", "trace_count": "-1"})
    sampled = [tracer.sample("m") for _ in range(9)]
    assert [bool(s) for s in sampled] == [False, False, True] * 3
    tracer.update({"trace_level": ["OFF"]}, "m")
    assert not any(tracer.sample("m") for _ in range(6))
    with pytest.raises(InvalidArgument, match="unknown trace setting 'trace_colour'"):
        tracer.update({"trace_colour": "red"})


SEQ = """
name: "s"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching { %s }
"""


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
            "must specify exactly one of int32_false_true, fp32_false_true or bool_false_true",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]',
            "must hold exactly two values, false then true",
        ),
        (
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
            "CONTROL_SEQUENCE_CORRID data_type must be one of",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },'
            ' { name: "B" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]',
            "sequence batching specifies multiple CONTROL_SEQUENCE_READY tensors",
        ),
        (
            'state [ { input_name: "IN" output_name: "OS" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "state input 'IN' of model 's' is also a model input",
        ),
        (
            'state [ { input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ -1 ] '
            'initial_state { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true name: "z" } } ]',
            "'initial_state' field for state input name 'IS' contains variable dimensions.",
        ),
        (
            'state [ { input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ 2 ] '
            'initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: "z" } } ]',
            "The data type used for 'initial_state' field of state 'IS' does not match the state data type.",
        ),
    ],
)
def test_sequence_batching_is_checked_with_tritons_words(section: str, message: str) -> None:
    config = parse_config_text(SEQ % section)
    with pytest.raises(ConfigError) as err:
        validate_config(config, "s")
    assert message in str(err.value)


def test_tracing_needs_a_trace_file_as_triton_says() -> None:
    tracer = Tracer()
    with pytest.raises(InvalidArgument, match="Attempting to set invalid trace setting :trace file name is not given"):
        tracer.update({"trace_level": ["TIMESTAMPS"]})
    assert tracer.settings()["trace_level"] == ["OFF"]  # a refused update changes nothing
    started = Tracer({"trace_file": "/tmp/t.json"})
    assert started.update({"trace_level": ["TIMESTAMPS"]}, "m")["trace_level"] == ["TIMESTAMPS"]
    assert started.settings()["trace_level"] == ["OFF"]
