"""Small ONNX graphs for datatype coverage, built with onnx.helper."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def unary(name: str, op: str, elem: int, dims: list[int | str]) -> onnx.ModelProto:
    """OUT = op(IN) with one input and one output of the same type."""
    graph = helper.make_graph(
        [helper.make_node(op, ["IN"], ["OUT"])],
        name,
        [helper.make_tensor_value_info("IN", elem, dims)],
        [helper.make_tensor_value_info("OUT", elem, dims)],
    )
    return _model(graph)


def binary(name: str, op: str, elem: int, dims: list[int | str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["A", "B"], ["OUT"])],
        name,
        [helper.make_tensor_value_info("A", elem, dims), helper.make_tensor_value_info("B", elem, dims)],
        [helper.make_tensor_value_info("OUT", elem, dims)],
    )
    return _model(graph)


def string_identity() -> onnx.ModelProto:
    return unary("strings", "Identity", TensorProto.STRING, ["batch", 4])


def bool_not() -> onnx.ModelProto:
    return unary("bools", "Not", TensorProto.BOOL, ["batch", 4])


def int64_add() -> onnx.ModelProto:
    return binary("int64s", "Add", TensorProto.INT64, ["batch", 4])


def fp16_add() -> onnx.ModelProto:
    return binary("fp16s", "Add", TensorProto.FLOAT16, ["batch", 4])
