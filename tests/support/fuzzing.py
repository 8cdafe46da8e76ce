"""Hypothesis strategies for requests as they may arrive off the network: mostly well-formed, often not."""

from __future__ import annotations

import json
import struct
from typing import Any

from hypothesis import strategies as st
from kubeinfer.server.grpc import grpc_service_pb2 as pb

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16"]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)  # fmt: skip
dims = st.integers(min_value=-3, max_value=2**64)
shapes = st.one_of(st.lists(st.integers(min_value=0, max_value=6), max_size=4), st.lists(dims, max_size=4), json_values)


@st.composite
def infer_inputs(draw: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "name": draw(st.one_of(st.sampled_from(["IN", "A", "B"]), st.text(max_size=8), json_values)),
        "datatype": draw(st.one_of(st.sampled_from(DATATYPES), st.text(max_size=6), json_values)),
        "shape": draw(shapes),
    }
    choice = draw(st.integers(0, 3))
    if choice == 0:
        item["data"] = draw(json_values)
    elif choice == 1:
        item["parameters"] = {"binary_data_size": draw(st.one_of(st.integers(-5, 64), json_values))}
    elif choice == 2:
        item["parameters"] = draw(json_values)
    if draw(st.booleans()):
        del item[draw(st.sampled_from(["name", "datatype", "shape"]))]
    return item


#: what an HTTP header value can carry (printable ASCII)
_header_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=5)


@st.composite
def http_bodies(draw: Any) -> tuple[bytes, str | None]:
    if draw(st.integers(0, 4)) == 0:  # raw bytes, sometimes with a header length
        raw = draw(st.binary(max_size=200))
        return raw, draw(st.one_of(st.none(), st.integers(-10, 300).map(str), _header_text))
    header: dict[str, Any] = {"inputs": draw(st.lists(infer_inputs(), max_size=4))}
    if draw(st.booleans()):
        header["outputs"] = draw(st.one_of(json_values, st.lists(st.fixed_dictionaries({"name": st.text(max_size=4), "parameters": json_values}), max_size=3)))  # fmt: skip
    if draw(st.booleans()):
        header["parameters"] = draw(json_values)
    if draw(st.booleans()):
        header["id"] = draw(json_values)
    head = json.dumps(header).encode()
    tail = draw(st.binary(max_size=96))
    if draw(st.booleans()):  # well-formed BYTES framing now and then
        tail = b"".join(struct.pack("<I", len(s)) + s for s in draw(st.lists(st.binary(max_size=8), max_size=4)))
    length = draw(st.one_of(st.just(len(head)), st.integers(-2, len(head) + len(tail) + 2)))
    return head + tail, str(length) if tail or draw(st.booleans()) else None


@st.composite
def grpc_requests(draw: Any) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=5)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        t = msg.inputs.add(
            name=draw(st.sampled_from(["IN", "A", ""]) | st.text(max_size=4)),
            datatype=draw(st.sampled_from(DATATYPES) | st.text(max_size=4)),
            shape=draw(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 5), max_size=4)),
        )
        if raw:
            msg.raw_input_contents.append(draw(st.binary(max_size=64)))
        else:
            field = draw(st.sampled_from(["bool_contents", "int_contents", "int64_contents", "uint_contents",
                                          "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents"]))  # fmt: skip
            values = {
                "bool_contents": st.booleans(),
                "int_contents": st.integers(-(2**31), 2**31 - 1),
                "int64_contents": st.integers(-(2**63), 2**63 - 1),
                "uint_contents": st.integers(0, 2**32 - 1),
                "uint64_contents": st.integers(0, 2**64 - 1),
                "fp32_contents": st.floats(width=32),
                "fp64_contents": st.floats(),
                "bytes_contents": st.binary(max_size=8),
            }[field]
            getattr(t.contents, field).extend(draw(st.lists(values, max_size=8)))
    if raw and draw(st.booleans()):
        msg.raw_input_contents.append(b"extra")
    for _ in range(draw(st.integers(0, 2))):
        out = msg.outputs.add(name=draw(st.text(max_size=4)))
        if draw(st.booleans()):
            out.parameters["classification"].int64_param = draw(st.integers(-5, 5))
    if draw(st.booleans()):
        msg.parameters["priority"].int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    if draw(st.booleans()):
        msg.parameters["timeout"].string_param = draw(st.text(max_size=4))
    return msg


PBTXT_PIECES = st.sampled_from([
    'name: "m"', 'platform: "onnxruntime_onnx"', 'backend: "python"', "max_batch_size: 8", "max_batch_size: -1",
    'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]', 'output [ { name: "O" data_type: TYPE_INVALID dims: [ 0 ] } ]',
    "dynamic_batching { preferred_batch_size: [ 4, 99 ] priority_levels: 2 default_priority_level: 3 }",
    "version_policy: { specific: { versions: [ -1 ] } }", "version_policy: { latest: { num_versions: 0 } }",
    'default_model_filename: "../x"', 'ensemble_scheduling { step [ { model_name: "m" } ] }', 'platform: "ensemble"',
    "instance_group [ { count: -2 gpus: [ -1 ] } ]", "{", "}", '"', "\\", "input [", "dims: [ 9223372036854775807 ]",
])  # fmt: skip
