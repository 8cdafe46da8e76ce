"""Small ONNX graphs for datatype coverage, built with onnx.helper."""

from __future__ import annotations

import numpy as np
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


def matmul(size: int, seed: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """OUT[batch, size] = IN[batch, size] @ W with a random FP32 weight W of size × size (4·size² bytes), and W:
    a model whose memory is its weight, and whose answer says which model answered."""
    from onnx import numpy_helper

    weight = np.random.default_rng(seed).standard_normal((size, size), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["IN", "W"], ["OUT"])],
        f"matmul{seed}",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["batch", size])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", size])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weight
