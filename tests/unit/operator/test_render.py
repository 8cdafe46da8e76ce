"""Spec → ModelConfig → config.pbtxt, checked by parsing the text back with the server's own parser."""

from __future__ import annotations

import pytest
from kubeinfer.operator.models.render import config_to_spec, render_model, spec_to_config
from kubeinfer.server.config import ConfigError, parse_config_text, pb, validate_config
from kubeinfer.server.config.version_policy import select_versions


def test_issue_example_renders_and_round_trips(model_spec):
    rendered = render_model("cifar10-resnet", model_spec)
    parsed = parse_config_text(rendered.config_text)
    validate_config(parsed, "cifar10-resnet")
    assert parsed == rendered.config
    assert parsed.name == "cifar10-resnet"
    assert parsed.max_batch_size == 64
    assert parsed.input[0].data_type == pb.TYPE_FP32
    assert list(parsed.input[0].dims) == [3, 32, 32]
    assert list(parsed.dynamic_batching.preferred_batch_size) == [16, 32]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 2000
    assert parsed.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    assert parsed.instance_group[0].count == 2
    assert rendered.filename == "model.onnx"
    assert sorted(rendered.versions) == [1, 2]
    assert rendered.versions[2].path == "uploads/resnet-v2.onnx"


def test_config_part_of_spec_round_trips(model_spec):
    config_part = {k: v for k, v in model_spec.items() if k not in ("server", "versions")}
    assert config_to_spec(spec_to_config("m", model_spec)) == config_part


def test_every_feature_renders():
    spec = {
        "backend": "python",
        "maxBatchSize": 8,
        "inputs": [{"name": "x", "dataType": "BYTES", "dims": [-1], "optional": True}],
        "outputs": [{"name": "y", "dataType": "INT64", "dims": [2], "reshape": {"shape": [1, 2]}}],
        "dynamicBatching": {
            "maxQueueDelayMicroseconds": 100,
            "priorityLevels": 2,
            "defaultPriorityLevel": 2,
            "defaultQueuePolicy": {"timeoutAction": "DELAY", "defaultTimeoutMicroseconds": 5000, "maxQueueSize": 9},
            "priorityQueuePolicy": {"1": {"maxQueueSize": 3, "allowTimeoutOverride": True}},
        },
        "instanceGroups": [{"name": "g", "count": 1, "kind": "KIND_CPU"}],
        "versionPolicy": {"specific": {"versions": [1]}},
        "parameters": {"threads": {"stringValue": "4"}},
        "optimization": {
            "executionAccelerators": {
                "gpuExecutionAccelerator": [{"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}]
            },
            "inputPinnedMemory": {"enable": True},
        },
        "modelWarmup": [
            {"name": "w", "batchSize": 1, "inputs": {"x": {"dataType": "BYTES", "dims": [1], "zeroData": True}}}
        ],
        "versions": [{"version": 1, "source": {"path": "m/model.py"}}],
    }
    rendered = render_model("py", spec)
    text = rendered.config_text
    parsed = parse_config_text(text)
    assert parsed.input[0].data_type == pb.TYPE_STRING
    assert parsed.dynamic_batching.priority_queue_policy[1].allow_timeout_override
    assert parsed.dynamic_batching.default_queue_policy.timeout_action == pb.ModelQueuePolicy.DELAY
    assert parsed.parameters["threads"].string_value == "4"
    accel = parsed.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert (accel.name, dict(accel.parameters)) == ("tensorrt", {"precision_mode": "FP16"})
    assert parsed.model_warmup[0].inputs["x"].zero_data
    assert rendered.filename == "model.py"
    assert config_to_spec(parsed) == {k: v for k, v in spec.items() if k != "versions"}


def test_pytorch_renders_with_its_model_file(model_spec):
    model_spec.update(
        platform="pytorch_libtorch",
        inputs=[{"name": "INPUT__0", "dataType": "FP32", "dims": [3, 32, 32]}],
        outputs=[{"name": "OUTPUT__0", "dataType": "FP32", "dims": [10]}],
        parameters={"INFERENCE_MODE": {"stringValue": "true"}},
    )
    rendered = render_model("resnet-classifier", model_spec)
    assert rendered.filename == "model.pt"
    parsed = parse_config_text(rendered.config_text)
    assert parsed.platform == "pytorch_libtorch" and parsed.parameters["INFERENCE_MODE"].string_value == "true"
    model_spec["defaultModelFilename"] = "model.pt2"
    assert render_model("resnet-classifier", model_spec).filename == "model.pt2"
    model_spec["defaultModelFilename"] = "../model.pt"
    with pytest.raises(ConfigError, match="default_model_filename"):
        render_model("resnet-classifier", model_spec)


def test_ensemble_has_no_model_file():
    spec = {
        "platform": "ensemble",
        "maxBatchSize": 4,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "ensembleScheduling": {
            "step": [{"modelName": "a", "modelVersion": -1, "inputMap": {"x": "IN"}, "outputMap": {"y": "OUT"}}]
        },
        "versions": [{"version": 1}],
    }
    rendered = render_model("ens", spec)
    assert rendered.filename is None
    assert parse_config_text(rendered.config_text).ensemble_scheduling.step[0].input_map == {"x": "IN"}


def test_model_operations_render_and_follow_the_servers_rule(model_spec):
    """An op library in the image by absolute path (what an operator user can ship); a relative entry is held to
    the server's file-name rule, in the server's words."""
    model_spec["modelOperations"] = {"opLibraryFilename": ["/opt/custom/libcustomops.so", "libmine.so"]}
    rendered = render_model("m", model_spec)
    parsed = parse_config_text(rendered.config_text)
    assert list(parsed.model_operations.op_library_filename) == ["/opt/custom/libcustomops.so", "libmine.so"]
    assert config_to_spec(parsed)["modelOperations"] == model_spec["modelOperations"]
    model_spec["modelOperations"] = {"opLibraryFilename": ["../other/libcustomops.so"]}
    with pytest.raises(ConfigError) as info:
        render_model("m", model_spec)
    assert "model_operations op_library_filename '../other/libcustomops.so' contains a path separator" in str(
        info.value
    )
    assert "or an absolute path to a library outside the model repository" in str(info.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"platform": "caffe2_netdef"}, "spec.platform 'caffe2_netdef' is not served"),
        ({"dynamicBatching": {"preferredBatchSize": [128]}}, "larger than max_batch_size"),
        ({"inputs": [{"name": "input", "dataType": "FP32", "dims": [0]}]}, "every dim must be a positive size"),
        ({"inputs": [{"name": "input", "dataType": "FP99", "dims": [1]}]}, "unknown dataType 'FP99'"),
        ({"versionPolicy": {"specific": {"versions": [7]}}}, "versions [7] that are not in spec.versions"),
        ({"bogusField": 1}, "unknown field 'bogusField'"),
    ],
)
def test_bad_specs_say_what_to_fix(model_spec, change, message):
    model_spec.update(change)
    with pytest.raises(ConfigError, match=None) as info:
        render_model("m", model_spec)
    assert message in str(info.value)


def test_backend_missing_from_server(model_spec):
    model_spec["platform"] = "tensorrt_plan"
    with pytest.raises(ConfigError) as info:
        render_model("m", model_spec, server_backends=["onnxruntime", "python"], server="cpu-pool")
    assert "InferenceServer 'cpu-pool' does not provide backend 'tensorrt'" in str(info.value)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({}, [3]),
        ({"latest": {"num_versions": 2}}, [2, 3]),
        ({"all": {}}, [1, 2, 3]),
        ({"specific": {"versions": [1, 9]}}, [1]),
        ({"latest": {"num_versions": 5}}, [1, 2, 3]),
        # Triton selects nothing for num_versions 0 (validation refuses such a config before this)
        ({"latest": {"num_versions": 0}}, []),
    ],
)
def test_target_versions_follow_the_policy(policy, expected):
    """The operator uses the server's own selection (config.version_policy), Triton's rules."""
    config = pb.ModelConfig()
    for key, value in policy.items():
        getattr(config.version_policy, key).SetInParent()
        for k, v in value.items():
            field = getattr(getattr(config.version_policy, key), k)
            if isinstance(v, list):
                field.extend(v)
            else:
                setattr(getattr(config.version_policy, key), k, v)
    assert select_versions(config, [3, 1, 2]) == expected
