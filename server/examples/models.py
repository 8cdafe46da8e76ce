"""Deterministic ONNX models built with onnx.helper (no network, no torch)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kubeinfer")
    model.ir_version = 8  # readable by every onnxruntime we support
    onnx.checker.check_model(model)
    return model


def add_sub(size: int = 16, batched: bool = True) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [batch, size]."""
    shape: list[int | str] = (["batch"] if batched else []) + [size]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    return _model(helper.make_graph(nodes, "add_sub", inputs, outputs))


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, array: np.ndarray, prefix: str) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        # He initialisation keeps activations in range through 18 layers (BN folded into the conv)
        w = self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        b = self.rng.standard_normal(cout) * 0.01
        y = self.name("conv")
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, self.const(w, "w"), self.const(b, "b")],
                [y],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[k // 2] * 4,
            )
        )
        if relu:
            r = self.name("relu")
            self.nodes.append(helper.make_node("Relu", [y], [r]))
            return r
        return y

    def block(self, x: str, cin: int, cout: int, stride: int) -> str:
        h = self.conv(x, cin, cout, 3, stride, relu=True)
        h = self.conv(h, cout, cout, 3, 1, relu=False)
        skip = x if stride == 1 and cin == cout else self.conv(x, cin, cout, 1, stride, relu=False)
        s = self.name("add")
        self.nodes.append(helper.make_node("Add", [h, skip], [s]))
        out = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [s], [out]))
        return out


def resnet18_cifar(num_classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 for 32x32 inputs: 3x3 stem, 4 stages of 2 basic blocks, global pool, linear head."""
    b = _Builder(seed)
    x = b.conv("input", 3, 64, 3, 1, relu=True)
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = b.block(x, cin, cout, stride)
        x = b.block(x, cout, cout, 1)
        cin = cout
    b.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
    b.nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], axis=1))
    w = b.rng.standard_normal((cin, num_classes)) * np.sqrt(1.0 / cin)
    bias = b.rng.standard_normal(num_classes) * 0.01
    b.nodes.append(helper.make_node("Gemm", ["flat", b.const(w, "fc_w"), b.const(bias, "fc_b")], ["output"]))
    graph = helper.make_graph(
        b.nodes,
        "cifar10_resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", num_classes])],
        initializer=b.inits,
    )
    return _model(graph)
