"""The config normaliser and Triton's JSON text, against what real Triton 2.51 answered for the same
config.pbtxt files (tests/support/config_parity; the live comparison is test_config_parity.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from kubeinfer.server.config import (
    ConfigError,
    config_from_json,
    config_to_triton_json,
    normalize_config,
    parse_config_text,
    pb,
    validate_config,
)
from kubeinfer.server.config.triton_json import _float
from kubeinfer.server.repository import scan
from tritonclient.grpc import model_config_pb2 as triton_pb

from tests.support import config_parity

RECORD = config_parity.record()["models"]
READY = sorted(n for n, e in RECORD.items() if e["state"] == "READY")
REFUSED = sorted(n for n, e in RECORD.items() if e["state"] != "READY")
#: served on Triton by a Python-based stand-in backend: only ``runtime`` tells (see record.py)
STAND_IN = {"onnxruntime", "pytorch", "tensorrt"}


def _loaded(tmp_path: Path, name: str) -> pb.ModelConfig:
    """The config as the server loads it: scanned (platform detection), validated, normalised."""
    repo = config_parity.write_repository(tmp_path / "repo", [name], lambda _m, _f: b"")
    source = scan.read_model(repo, name)
    assert source.config is not None, source.error
    validate_config(source.config, name)
    normalize_config(source.config, gpus=())
    return source.config


def _expected_http(name: str) -> str:
    text: str = RECORD[name]["http"]
    if json.loads(text)["backend"] in STAND_IN:
        text = text.replace('"runtime":"model.py"', '"runtime":""', 1)
    return text


@pytest.mark.parametrize("name", READY)
def test_http_text_is_tritons_byte_for_byte(tmp_path: Path, name: str) -> None:
    assert config_to_triton_json(_loaded(tmp_path, name)) == _expected_http(name)


@pytest.mark.parametrize("name", READY)
def test_grpc_message_is_tritons_field_for_field(tmp_path: Path, name: str) -> None:
    wire = _loaded(tmp_path, name).SerializeToString()
    got = json_format.MessageToDict(triton_pb.ModelConfig.FromString(wire), preserving_proto_field_name=True)
    expected: dict[str, Any] = dict(RECORD[name]["grpc"])
    if expected.get("runtime") == "model.py" and expected["backend"] in STAND_IN:
        del expected["runtime"]
    assert got == expected


@pytest.mark.parametrize("name", [n for n in READY if RECORD[n]["initialize"]])
def test_python_stub_got_the_same_text(name: str) -> None:
    """Triton hands ``initialize`` the very text its config endpoint answers (so one renderer serves both)."""
    for args in RECORD[name]["initialize"].values():
        assert args["model_config"] == RECORD[name]["http"]


@pytest.mark.parametrize("name", REFUSED)
def test_instance_groups_triton_refuses_are_refused_with_its_words(tmp_path: Path, name: str) -> None:
    repo = config_parity.write_repository(tmp_path / "repo", [name], lambda _m, _f: b"")
    source = scan.read_model(repo, name)
    assert source.config is not None
    with pytest.raises(ConfigError) as refused:
        normalize_config(source.config, gpus=())
    assert RECORD[name]["reason"] == f"Invalid argument: {refused.value}"


def test_normalising_twice_changes_nothing(tmp_path: Path) -> None:
    for name in READY:
        config = _loaded(tmp_path / name, name)
        again = pb.ModelConfig()
        again.CopyFrom(config)
        normalize_config(again, gpus=())
        assert again == config, name


def test_gpus_decide_kind_auto_and_fill_kind_gpu_groups() -> None:
    config = parse_config_text(
        'name: "m" backend: "onnxruntime" instance_group [ { kind: KIND_AUTO }, { kind: KIND_GPU count: 2 },'
        " { kind: KIND_AUTO gpus: [ 1 ] }, { kind: KIND_CPU } ]"
    )
    normalize_config(config, gpus=[0, 1])
    groups = [(g.name, pb.ModelInstanceGroup.Kind.Name(g.kind), g.count, list(g.gpus)) for g in config.instance_group]
    assert groups == [
        ("m_0", "KIND_GPU", 1, [0, 1]),
        ("m_1", "KIND_GPU", 2, [0, 1]),
        ("m_2", "KIND_GPU", 1, [1]),
        # onnxruntime CPU groups default to two instances
        ("m_3", "KIND_CPU", 2, []),
    ]
    # a listed gpu that is not there makes KIND_AUTO a CPU group, which then may not list gpus
    config = parse_config_text('name: "m" backend: "python" instance_group [ { kind: KIND_AUTO gpus: [ 3 ] } ]')
    with pytest.raises(ConfigError, match="instance group m_0 of model m has kind KIND_CPU but specifies one or more"):
        normalize_config(config, gpus=[0, 1])


def test_a_gpu_that_is_not_there_is_refused_in_tritons_words() -> None:
    config = parse_config_text('name: "m" backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 2 ] } ]')
    with pytest.raises(ConfigError) as refused:
        normalize_config(config, gpus=[0, 1])
    assert str(refused.value) == (
        "instance group m_0 of model m specifies invalid or unsupported gpu id 2. GPUs with at least the "
        "minimum required CUDA compute compatibility of 6.000000 are: 0, 1"
    )


def test_ensembles_get_a_policy_and_a_transaction_policy_only() -> None:
    config = parse_config_text('name: "e" platform: "ensemble" ensemble_scheduling { step [ { model_name: "x" } ] }')
    normalize_config(config, gpus=[0])
    assert config.version_policy.latest.num_versions == 1
    assert config.HasField("model_transaction_policy") and not config.model_transaction_policy.decoupled
    assert not config.instance_group and not config.HasField("optimization")
    assert '"max_inflight_requests"' not in config_to_triton_json(config)  # not in Triton 2.51's schema


def test_triton_json_reads_back_into_the_same_config(tmp_path: Path) -> None:
    """A client may send what GET .../config answered as a load override: it parses to the same config."""
    for name in READY:
        config = _loaded(tmp_path / name, name)
        assert config_from_json(config_to_triton_json(config)) == config, name


@pytest.mark.parametrize(
    ("value", "single", "text"),
    [
        # protobuf C++ prints %.6g (then %.9g), rapidjson re-reads integers as integers and writes
        # doubles in its shortest form (Prettify): the py_float record holds 0.25, 0.5 and 1e20
        (0.0, True, "0"),
        (1.0, True, "1"),
        (-2.0, True, "-2"),
        (123456.0, True, "123456"),
        (1e6, True, "1000000.0"),
        (0.25, True, "0.25"),
        (1e20, True, "100000000000000000000.0"),
        (1e22, True, "1e22"),
        (1e-5, True, "0.00001"),
        (1e-7, True, "1e-7"),
        (float(np.float32(0.1234567)), True, "0.123456702"),
        (0.1, False, "0.1"),
        (float("nan"), True, '"NaN"'),
        (float("-inf"), False, '"-Infinity"'),
    ],
)
def test_floats_are_written_as_triton_writes_them(value: float, single: bool, text: str) -> None:
    assert _float(value, single) == text


def test_map_entries_are_written_in_key_order() -> None:
    """Triton writes map entries in its hash map's order, which differs between two runs of the same
    server (seen with 2.51: parameters z,a,m,b,y,c came out as m,a,c,b,z,y, then c,z,m,y,b,a); any order
    is Triton's, so kubeinfer picks a stable one."""
    config = parse_config_text(
        'name: "m" parameters [ { key: "z" value: { string_value: "1" } }, { key: "a" value: { string_value: "2" } },'
        ' { key: "m" value: { string_value: "3" } } ]'
    )
    text = config_to_triton_json(config)
    assert '"parameters":{"a":{"string_value":"2"},"m":{"string_value":"3"},"z":{"string_value":"1"}}' in text
