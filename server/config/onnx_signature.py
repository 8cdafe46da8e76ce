"""An ONNX file's graph inputs, outputs and initializer names, read without holding the file.

One reader for both users of ONNX signatures: the operator's early check (``kubeinfer.operator.onnx_check``)
and the ONNX Runtime backend's auto-complete and load check; the rules they apply live in ``onnx_rules``.

``onnx.load`` parses the whole protobuf: a 1 GiB model costs over 2 GiB of memory (the bytes and the
parsed copy) and seconds of a thread, so one tenant's upload could crash the operator for everyone
(OOM, then a crash loop). Only a few small messages matter for the config
check, so this walks the protobuf wire format (varint tags and lengths, four wire types) with seeks:
weights (``raw_data``, packed floats) and node lists are skipped, never read, and the memory held is
bounded by ``budget``, the time by ``deadline``. The small messages themselves are parsed by onnx's
own protobuf classes.

Protobuf semantics kept: a message field that appears more than once is merged, so every
``ModelProto.graph`` occurrence is read and repeated fields add up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

import onnx
from google.protobuf.message import DecodeError

#: ModelProto.graph; GraphProto.initializer / input / output / sparse_initializer; TensorProto.name;
#: SparseTensorProto.values (field numbers from onnx.proto)
MODEL_GRAPH = 7
GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_SPARSE_INITIALIZER = 5, 11, 12, 15
TENSOR_NAME = 8
SPARSE_VALUES = 1
#: bytes of small messages held at once (the inputs, outputs and initializer names)
DEFAULT_BUDGET = 64 << 20
#: fields read between two looks at the clock
TICK = 4096


class Malformed(Exception):
    """Not a protobuf ModelProto (truncated, a bad tag, a length past the end)."""


class LimitExceeded(Exception):
    """The check needed more time or memory than it may use; ``limit`` is 'time' or 'memory'."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass
class Signature:
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    initializers: set[str] = field(default_factory=set)


class Tensor(NamedTuple):
    """A graph input or output as a config sees it: its config data type name (``TYPE_INVALID`` for an
    element type the config cannot name) and dims, -1 for a symbolic or unknown dimension."""

    name: str
    data_type: str
    dims: list[int]


#: ONNX TensorProto element type → config enum name
ONNX_TO_CONFIG = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}


def _tensors(values: list[onnx.ValueInfoProto], skip: set[str]) -> list[Tensor]:
    result = []
    for v in values:
        if v.name in skip:
            continue  # IR 3 style: a weight listed among the inputs too is no input a client feeds
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim]
        result.append(Tensor(v.name, ONNX_TO_CONFIG.get(t.elem_type, "TYPE_INVALID"), dims))
    return result


def graph_tensors(sig: Signature) -> tuple[list[Tensor], list[Tensor]]:
    """The graph's inputs (initializers left out) and outputs, as a config sees them."""
    return _tensors(sig.inputs, sig.initializers), _tensors(sig.outputs, set())


class _Wire:
    """Sequential reader of protobuf fields between two offsets of a seekable file."""

    def __init__(self, f: BinaryIO, deadline: float, budget: int) -> None:
        self.f = f
        self.pos = 0
        self.deadline = deadline
        self.budget = self.limit = budget
        self.fields = 0

    def _byte(self) -> int:
        b = self.f.read(1)
        if not b:
            raise Malformed(f"truncated at byte {self.pos}")
        self.pos += 1
        return b[0]

    def varint(self) -> int:
        result = 0
        for shift in range(0, 70, 7):
            b = self._byte()
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
        raise Malformed(f"a varint longer than 10 bytes at byte {self.pos}")

    def seek(self, pos: int) -> None:
        if pos != self.pos:
            self.f.seek(pos)
            self.pos = pos

    def take(self, n: int) -> bytes:
        """Read ``n`` bytes to keep, charged to the budget."""
        if n > self.budget:
            raise LimitExceeded(
                "memory", f"its graph's inputs, outputs and names take more than {self.limit >> 20} MiB"
            )
        data = self.f.read(n)
        if len(data) != n:
            raise Malformed(f"truncated at byte {self.pos + len(data)}")
        self.budget -= n
        self.pos += n
        return data

    def walk(self, end: int) -> Iterator[tuple[int, int, int]]:
        """Yield (field number, start, length) of each length-delimited field before ``end``; skip the rest.

        After each yield the reader continues after that field, whatever the caller read of it.
        """
        while self.pos < end:
            self.fields += 1
            if self.fields % TICK == 0 and time.monotonic() > self.deadline:
                raise LimitExceeded("time", "reading its graph took longer than its time limit")
            tag = self.varint()
            number, wire = tag >> 3, tag & 7
            if number == 0:
                raise Malformed(f"field number 0 at byte {self.pos}")
            if wire == 0:
                self.varint()
            elif wire == 1:
                self.seek(self.pos + 8)
            elif wire == 5:
                self.seek(self.pos + 4)
            elif wire == 2:
                length = self.varint()
                start = self.pos
                if start + length > end:
                    raise Malformed(f"a field at byte {start} runs past its message")
                yield number, start, length
                self.seek(start + length)
            else:
                raise Malformed(f"wire type {wire} (groups are not used by ONNX) at byte {self.pos}")
            if self.pos > end:
                raise Malformed(f"a field runs past its message at byte {end}")


def _tensor_name(wire: _Wire, start: int, length: int) -> str | None:
    name = None
    wire.seek(start)
    for number, s, n in wire.walk(start + length):
        if number == TENSOR_NAME:
            wire.seek(s)
            name = wire.take(n).decode("utf-8", "replace")  # the last one wins, as in protobuf
    return name


def _value_info(wire: _Wire, start: int, length: int) -> onnx.ValueInfoProto:
    wire.seek(start)
    try:
        return onnx.ValueInfoProto.FromString(wire.take(length))
    except DecodeError:
        raise Malformed(f"the graph input/output at byte {start} is not a ValueInfoProto") from None


def read_signature(f: BinaryIO, *, timeout: float = 60.0, budget: int = DEFAULT_BUDGET) -> Signature:
    """The graph's inputs, outputs and initializer names of the ModelProto in ``f`` (a seekable file)."""
    size = os.fstat(f.fileno()).st_size
    wire = _Wire(f, time.monotonic() + timeout, budget)
    sig = Signature()
    graphs = [(s, n) for number, s, n in wire.walk(size) if number == MODEL_GRAPH]
    for graph_start, graph_length in graphs:
        wire.seek(graph_start)
        for number, s, n in wire.walk(graph_start + graph_length):
            if number == GRAPH_INPUT:
                sig.inputs.append(_value_info(wire, s, n))
            elif number == GRAPH_OUTPUT:
                sig.outputs.append(_value_info(wire, s, n))
            elif number == GRAPH_INITIALIZER:
                name = _tensor_name(wire, s, n)
                if name is not None:
                    sig.initializers.add(name)
            elif number == GRAPH_SPARSE_INITIALIZER:
                wire.seek(s)
                for inner, ts, tn in wire.walk(s + n):
                    if inner == SPARSE_VALUES:
                        name = _tensor_name(wire, ts, tn)
                        if name is not None:
                            sig.initializers.add(name)
    return sig
