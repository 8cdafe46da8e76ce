"""The streaming read of an ONNX file's signature (server/config/onnx_signature.py) against onnx.load itself.

Every model here is read both ways and must give the same inputs, outputs and initializer names; the
limits (time, memory) and malformed files end in their own exceptions, nothing else.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.onnx_check import check_onnx
from kubeinfer.server.config.onnx_signature import LimitExceeded, Malformed, Signature, read_signature
from onnx import TensorProto, helper, numpy_helper

from tests.support.models import binary, fp16_add, string_identity, unary
from tests.support.onnx_files import write_big_model


def _with_initializer_input() -> onnx.ModelProto:
    """IR 3 style: the weight is listed among the graph inputs too (the check must skip it)."""
    w = numpy_helper.from_array(np.ones((4,), "float32"), "W")
    graph = helper.make_graph(
        [helper.make_node("Add", ["IN", "W"], ["OUT"])],
        "init-input",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, [4]), helper.make_tensor_value_info("W", 1, [4])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [4])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _with_sparse_initializer() -> onnx.ModelProto:
    model = _with_initializer_input()
    values = numpy_helper.from_array(np.ones((1,), "float32"), "S")
    indices = numpy_helper.from_array(np.zeros((1,), "int64"), "S_idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    model.graph.input.append(helper.make_tensor_value_info("S", TensorProto.FLOAT, [4]))
    return model


MODELS = {
    "unary": unary("u", "Relu", TensorProto.FLOAT, ["batch", 4]),
    "binary": binary("b", "Add", TensorProto.INT32, [2, 3]),
    "strings": string_identity(),
    "fp16": fp16_add(),
    "initializer-input": _with_initializer_input(),
    "sparse": _with_sparse_initializer(),
}


def _reference(model: onnx.ModelProto) -> Signature:
    g = model.graph
    names = {i.name for i in g.initializer} | {s.values.name for s in g.sparse_initializer}
    return Signature(list(g.input), list(g.output), names)


def _read(data: bytes, tmp_path: Path, **kw) -> Signature:
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    with open(path, "rb") as f:
        return read_signature(f, **kw)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_signature_as_onnx_load(name: str, tmp_path: Path) -> None:
    data = MODELS[name].SerializeToString()
    assert _read(data, tmp_path) == _reference(onnx.load_from_string(data))


def test_a_graph_given_twice_is_merged_as_protobuf_does(tmp_path: Path) -> None:
    """ModelProto.graph twice: protobuf merges them (repeated fields add up); the streaming read too."""
    a, b = MODELS["unary"], MODELS["initializer-input"]
    data = a.SerializeToString() + onnx.ModelProto(graph=b.graph).SerializeToString()
    merged = onnx.load_from_string(data)
    assert len(merged.graph.input) == 3
    assert _read(data, tmp_path) == _reference(merged)


def test_a_big_sparse_model_is_read_without_its_weights(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    size = write_big_model(path, 64 << 20)
    with open(path, "rb") as f:
        started = time.monotonic()
        sig = read_signature(f, budget=1 << 20)  # 1 MiB is plenty: the weight is skipped, not read
        took = time.monotonic() - started
    assert [i.name for i in sig.inputs] == ["IN"] and sig.initializers == {"W"}
    assert sig == _reference(onnx.load(str(path)))
    assert took < 1.0 and size > 64 << 20


def _many_nodes(count: int) -> bytes:
    """A ModelProto whose graph holds ``count`` empty NodeProto fields (2 bytes each)."""
    graph = MODELS["unary"].graph.SerializeToString() + b"\x0a\x00" * count
    n, length = bytearray(), len(graph)
    while True:
        byte, length = length & 0x7F, length >> 7
        n.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"\x08\x08" + b"\x3a" + bytes(n) + graph  # ir_version 8, then field 7 (graph)


def test_the_time_limit(tmp_path: Path) -> None:
    data = _many_nodes(200_000)
    assert len(onnx.load_from_string(data).graph.node) == 200_001
    assert [i.name for i in _read(data, tmp_path).inputs] == ["IN"]
    with pytest.raises(LimitExceeded) as err:
        _read(data, tmp_path, timeout=0.0)
    assert err.value.limit == "time"


def test_the_memory_limit(tmp_path: Path) -> None:
    model = onnx.ModelProto()
    model.CopyFrom(MODELS["unary"])
    model.graph.input[0].doc_string = "x" * (2 << 20)
    with pytest.raises(LimitExceeded) as err:
        _read(model.SerializeToString(), tmp_path, budget=1 << 20)
    assert err.value.limit == "memory" and "more than 1 MiB" in str(err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (MODELS["unary"].SerializeToString()[:-3], "runs past"),
        (b"\x3a\xff\xff\xff\xff\x0f", "runs past"),
        (b"\x00\x01", "field number 0"),
        (b"\x0b\x0c", "wire type 3"),
        (b"\x08" + b"\xff" * 11, "varint longer than 10 bytes"),
    ],
)
def test_malformed_files(data: bytes, message: str, tmp_path: Path) -> None:
    with pytest.raises(Malformed, match=message):
        _read(data, tmp_path)


def test_random_and_mutated_bytes_never_escape_as_other_errors(tmp_path: Path) -> None:
    rng = random.Random(23)
    seeds = [m.SerializeToString() for m in MODELS.values()]
    for i in range(400):
        if i % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        else:
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        try:
            _read(data, tmp_path, budget=1 << 20)
        except (Malformed, LimitExceeded):
            pass


def _spec(dims: list[int]) -> dict:
    return {
        "server": "s",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": dims}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": dims}],
        "versions": [{"version": 1, "source": {"path": "m.onnx"}}],
    }


def test_check_onnx_reports_mismatches_limits_and_unreadable_files(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    write_big_model(path, 1 << 20)
    assert check_onnx(path, render_model("m", _spec([4])).config, 1) == []
    problems = check_onnx(path, render_model("m", _spec([5])).config, 1)
    assert (
        problems
        and "version 1: input 'IN' has dims [5] in the config but [4] (without the batch dimension) in the ONNX model"
        in problems[0]
    )
    with pytest.raises(ArtifactError) as err:
        check_onnx(path, render_model("m", _spec([4])).config, 1, budget=16)
    assert err.value.reason == "CheckLimitExceeded" and "memory limit" in err.value.message
    path.write_bytes(b"\x0b garbage")
    assert (
        "version 1: cannot read ONNX model model.onnx: wire type 3"
        in check_onnx(path, render_model("m", _spec([4])).config, 1)[0]
    )
    os.symlink(path, tmp_path / "link.onnx")
    assert (
        "cannot read ONNX model link.onnx"
        in check_onnx(tmp_path / "link.onnx", render_model("m", _spec([4])).config, 1)[0]
    )
