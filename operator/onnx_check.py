"""Does a config's inputs/outputs agree with the ONNX file? Checked before a version goes live.

The most common config.pbtxt mistake is the batch dimension (dims must exclude it when
maxBatchSize > 0); catching it here turns a load failure on every server replica into one clear
message on the InferenceModel.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import onnx
from kubeinfer.server.config import pb
from kubeinfer.server.vocabulary import datatypes
from onnx import helper


def _onnx_tensors(values: Iterable[onnx.ValueInfoProto], skip: set[str]) -> dict[str, tuple[str | None, list[int]]]:
    out = {}
    for vi in values:
        if vi.name in skip:
            continue
        ttype = vi.type.tensor_type
        try:
            dtype = datatypes.from_numpy(helper.tensor_dtype_to_np_dtype(ttype.elem_type)).v2
        except Exception:
            dtype = None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
        out[vi.name] = (dtype, dims)
    return out


def check_onnx(path: Path, config: pb.ModelConfig, version: int) -> list[str]:
    """Mismatches between ``config`` and the ONNX model at ``path``, as messages (empty if they agree)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        return [f"version {version}: {path.name} is not a readable ONNX model ({exc})"]
    initializers = {i.name for i in model.graph.initializer}
    problems: list[str] = []
    batching = config.max_batch_size > 0
    for kind, declared, actual in (
        ("input", config.input, _onnx_tensors(list(model.graph.input), initializers)),
        ("output", config.output, _onnx_tensors(list(model.graph.output), set())),
    ):
        for t in declared:
            where = f"version {version}: {kind} '{t.name}'"
            if t.name not in actual:
                problems.append(f"{where} is not in the ONNX model, whose {kind}s are {sorted(actual)}")
                continue
            dtype, dims = actual[t.name]
            want_type = datatypes.config_to_v2(pb.DataType.Name(t.data_type))
            if dtype and dtype != want_type:
                problems.append(f"{where} is {dtype} in the ONNX model, but dataType says {want_type}")
            shape = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            if batching:
                if not dims:
                    problems.append(f"{where}: the ONNX tensor has no batch dimension but maxBatchSize > 0")
                    continue
                dims = dims[1:]
            if len(dims) != len(shape) or any(a != b and -1 not in (a, b) for a, b in zip(dims, shape, strict=True)):
                hint = (
                    " (dims must not include the batch dimension when maxBatchSize > 0)"
                    if batching and len(shape) == len(dims) + 1
                    else " (with maxBatchSize 0, dims include the batch dimension)"
                    if not batching and len(shape) + 1 == len(dims)
                    else ""
                )
                problems.append(
                    f"{where} has dims {shape} but the ONNX model's shape is "
                    f"{dims if not batching else ['batch', *dims]}{hint}"
                )
    return problems
