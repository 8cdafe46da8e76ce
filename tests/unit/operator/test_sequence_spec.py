"""The InferenceModel CRD's sequenceBatching and responseCache sections: generated from the proto,
rendered to a config.pbtxt the server accepts, bounded for the API server's CEL cost budget."""

from __future__ import annotations

import pytest
from kubeinfer.operator.api.model_crd import inference_model_spec_schema
from kubeinfer.operator.models.render import config_to_spec, render_model, spec_to_config
from kubeinfer.server.config import ConfigError, parse_config_text, pb, validate_config

SPEC = {
    "backend": "onnxruntime",
    "maxBatchSize": 4,
    "inputs": [{"name": "INPUT", "dataType": "INT32", "dims": [1]}],
    "outputs": [{"name": "OUTPUT", "dataType": "INT32", "dims": [1]}],
    "sequenceBatching": {
        "maxSequenceIdleMicroseconds": 5000000,
        "oldest": {"maxCandidateSequences": 8, "preferredBatchSize": [4], "maxQueueDelayMicroseconds": 100},
        "controlInput": [
            {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32FalseTrue": [0, 1]}]},
            {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "dataType": "BYTES"}]},
        ],
        "state": [
            {
                "inputName": "INPUT_STATE",
                "outputName": "OUTPUT_STATE",
                "dataType": "FP32",
                "dims": [-1],
                "initialState": [{"dataType": "FP32", "dims": [3], "dataFile": "state.bin", "name": "init"}],
            }
        ],
    },
    "responseCache": {"enable": True},
    "versions": [{"version": 1, "source": {"path": "m/model.onnx"}}],
}


def test_sequence_batching_renders_to_a_config_the_server_accepts() -> None:
    rendered = render_model("stateful", SPEC)
    parsed = parse_config_text(rendered.config_text)
    validate_config(parsed, "stateful")
    sb = parsed.sequence_batching
    assert sb.max_sequence_idle_microseconds == 5_000_000
    assert sb.oldest.max_candidate_sequences == 8
    assert sb.control_input[1].control[0].data_type == pb.TYPE_STRING
    assert sb.state[0].initial_state[0].data_file == "state.bin"
    assert parsed.response_cache.enable is True
    # the spec round-trips through the config (CONTROL_SEQUENCE_START is the enum's default, so the way
    # back leaves it out, as protobuf JSON does)
    config = spec_to_config("stateful", SPEC)
    assert spec_to_config("stateful", {**config_to_spec(config), "versions": SPEC["versions"]}) == config


def test_a_bad_sequence_section_is_refused_with_the_servers_words() -> None:
    spec = {
        **SPEC,
        "sequenceBatching": {"controlInput": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]},
    }
    with pytest.raises(
        ConfigError, match="must specify exactly one of int32_false_true, fp32_false_true or bool_false_true"
    ):
        validate_config(spec_to_config("stateful", spec), "stateful")


def test_crd_schema_has_bounded_sequence_lists() -> None:
    props = inference_model_spec_schema()["properties"]
    sb = props["sequenceBatching"]["properties"]
    assert sb["controlInput"]["maxItems"] == 128
    assert sb["state"]["items"]["properties"]["initialState"]["maxItems"] == 1
    assert (
        sb["controlInput"]["items"]["properties"]["control"]["items"]["properties"]["int32FalseTrue"]["maxItems"] == 2
    )
    assert (
        "x-kubernetes-validations" in sb["state"]["items"]["properties"]["initialState"]["items"]
    )  # zeroData xor dataFile
    assert props["responseCache"]["properties"]["enable"]["type"] == "boolean"
