"""ONNX files for the operator's check: one with a weight of any size, written as a sparse file.

The weight's bytes are a hole in the file (no disk used), yet ``onnx.load`` reads them as zeros, so a
"1 GiB model" costs nothing to make and is a real, valid ModelProto.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited field."""
    return _varint(number << 3 | 2) + _varint(length)


def write_big_model(path: Path, weight_bytes: int, dims: list[int | str] | None = None) -> int:
    """OUT = Identity(IN) plus an unused FLOAT initializer 'W' of ``weight_bytes`` bytes; returns the file size."""
    assert weight_bytes % 4 == 0
    dims = dims or ["batch", 4]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])],
        "big",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    head = onnx.TensorProto(name="W", dims=[weight_bytes // 4], data_type=TensorProto.FLOAT).SerializeToString()
    tensor_length = len(head) + len(_field(9, weight_bytes)) + weight_bytes  # raw_data (9) last
    graph_bytes = model.graph.SerializeToString()
    graph_length = len(graph_bytes) + len(_field(5, tensor_length)) + tensor_length  # initializer (5) last
    model.ClearField("graph")
    prefix = (
        model.SerializeToString()
        + _field(7, graph_length)  # ModelProto.graph, last
        + graph_bytes
        + _field(5, tensor_length)
        + head
        + _field(9, weight_bytes)
    )
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(len(prefix) + weight_bytes)  # the weight: a hole of zeros
    return len(prefix) + weight_bytes
