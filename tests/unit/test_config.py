"""The config schema: Triton's config.pbtxt files parse unchanged, validation explains itself."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from kubeinfer.server.config import (
    ConfigError,
    config_from_json,
    config_to_dict,
    config_to_text,
    parse_config_text,
    pb,
    validate_config,
)

# Configs as written in Triton's documentation (model_configuration.md, batcher.md, ensemble docs,
# optimization.md, python_backend README).
TRITON_DOC_CONFIGS = {
    "minimal_onnx": """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "input0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "input1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "output0" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """,
    "reshape": """
        name: "reshaped"
        platform: "tensorrt_plan"
        max_batch_size: 8
        input [ { name: "in" dims: [ 1 ] reshape: { shape: [ ] } data_type: TYPE_FP32 } ]
        output [ { name: "out" dims: [ 1 ] reshape: { shape: [ ] } data_type: TYPE_FP32 label_filename: "labels.txt" } ]
    """,
    "dynamic_batching_full": """
        name: "batched"
        backend: "onnxruntime"
        max_batch_size: 64
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
        dynamic_batching {
          preferred_batch_size: [ 4, 8 ]
          max_queue_delay_microseconds: 100
          preserve_ordering: true
          priority_levels: 2
          default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true }
          priority_queue_policy { key: 1 value: { max_queue_size: 4 timeout_action: REJECT } }
        }
        instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] }, { count: 1 kind: KIND_CPU } ]
        version_policy: { specific { versions: [ 1, 3 ] } }
        parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
        optimization { execution_accelerators { gpu_execution_accelerator : [ {
            name : "tensorrt"
            parameters { key: "precision_mode" value: "FP16" }
            parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }
        model_warmup [ { name: "warm" batch_size: 8 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]
        response_cache { enable: true }
    """,
    "sequence": """
        name: "seq"
        backend: "python"
        max_batch_size: 4
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]
        }
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """,
    "ensemble": """
        name: "ensemble_model"
        platform: "ensemble"
        max_batch_size: 1
        input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "CLASSIFICATION" data_type: TYPE_FP32 dims: [ 1000 ] }, { name: "SEGMENTATION" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        ensemble_scheduling {
          step [
            { model_name: "image_preprocess_model" model_version: -1
              input_map { key: "RAW_IMAGE" value: "IMAGE" }
              output_map { key: "PREPROCESSED_OUTPUT" value: "preprocessed_image" } },
            { model_name: "classification_model" model_version: -1
              input_map { key: "FORMATTED_IMAGE" value: "preprocessed_image" }
              output_map { key: "CLASSIFICATION_OUTPUT" value: "CLASSIFICATION" } },
            { model_name: "segmentation_model" model_version: -1
              input_map { key: "FORMATTED_IMAGE" value: "preprocessed_image" }
              output_map { key: "SEGMENTATION_OUTPUT" value: "SEGMENTATION" } }
          ]
        }
    """,
}


@pytest.mark.parametrize("key", sorted(TRITON_DOC_CONFIGS))
def test_triton_documentation_configs_parse_validate_and_round_trip(key: str) -> None:
    config = parse_config_text(TRITON_DOC_CONFIGS[key])
    validate_config(config, config.name or None)
    again = parse_config_text(config_to_text(config))
    assert again == config
    assert config_from_json(__import__("json").dumps(config_to_dict(config))) == config


def test_json_shape_matches_triton() -> None:
    config = parse_config_text(TRITON_DOC_CONFIGS["dynamic_batching_full"])
    data = config_to_dict(config)
    assert data["max_batch_size"] == 64
    assert data["input"][0]["dims"] == [-1]  # 64-bit ints as numbers, not strings
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["dynamic_batching"]["priority_queue_policy"]["1"]["max_queue_size"] == 4
    assert data["version_policy"]["specific"]["versions"] == [1, 3]


def test_wire_compatible_with_tritonclient_model_config() -> None:
    """Our schema encodes to bytes that tritonclient's own ModelConfig decodes field for field."""
    from tritonclient.grpc import model_config_pb2 as theirs

    for text in TRITON_DOC_CONFIGS.values():
        ours = parse_config_text(text)
        decoded = theirs.ModelConfig.FromString(ours.SerializeToString())
        assert json_format.MessageToDict(decoded) == json_format.MessageToDict(ours)


def test_every_tritonclient_field_exists_with_the_same_number() -> None:
    from tritonclient.grpc import model_config_pb2 as theirs

    def walk(their_desc, our_desc, path):  # type: ignore[no-untyped-def]
        for f in their_desc.fields:
            assert f.name in our_desc.fields_by_name, f"{path}.{f.name} missing"
            mine = our_desc.fields_by_name[f.name]
            assert mine.number == f.number, f"{path}.{f.name} number"
            assert mine.type == f.type, f"{path}.{f.name} type"
            if f.message_type is not None and not f.message_type.GetOptions().map_entry:
                walk(f.message_type, mine.message_type, f"{path}.{f.name}")

    walk(theirs.ModelConfig.DESCRIPTOR, pb.ModelConfig.DESCRIPTOR, "ModelConfig")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "other" platform: "onnxruntime_onnx"', "does not match the model folder name"),
        ('platform: "caffe2_netdef"', "unknown platform 'caffe2_netdef'"),
        ('backend: "nope"', "unknown backend 'nope'"),
        ('platform: "onnxruntime_onnx" input [ { name: "x" data_type: TYPE_FP32 dims: [ 0 ] } ]', "every dim"),
        ('platform: "onnxruntime_onnx" input [ { name: "x" dims: [ 3 ] } ]', "has no data_type"),
        ('platform: "onnxruntime_onnx" input [ { name: "x" data_type: TYPE_FP32 dims: [ -2 ] } ]', "every dim"),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]'
            " dynamic_batching { preferred_batch_size: [ 8 ] }",
            "larger than max_batch_size 4",
        ),
        (
            'platform: "onnxruntime_onnx" input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3 ] } } ]',
            "same number of elements",
        ),
        ('platform: "onnxruntime_onnx" version_policy: { latest { num_versions: 0 } }', "at least 1"),
        ('platform: "onnxruntime_onnx" max_batch_size: -1', "max_batch_size must be >= 0"),
        ('platform: "ensemble"', "needs ensemble_scheduling"),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 4 dynamic_batching { priority_levels: 2 '
            "default_priority_level: 3 }",
            "default_priority_level must be in 1..2",
        ),
    ],
)
def test_validation_messages_say_what_to_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config(parse_config_text(text), "mymodel")


def test_parse_error_names_the_file_and_position() -> None:
    with pytest.raises(ConfigError, match=r"failed to parse config.pbtxt: 1:\d+"):
        parse_config_text('max_batch_size: "eight"')


def test_max_batch_size_presence_is_tracked() -> None:
    assert not parse_config_text('platform: "onnxruntime_onnx"').HasField("max_batch_size")
    assert parse_config_text("max_batch_size: 0").HasField("max_batch_size")
