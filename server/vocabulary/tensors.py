"""Wire-neutral tensor (de)serialization shared by HTTP and gRPC: raw bytes and typed lists."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from . import datatypes
from .errors import InvalidArgument
from .limits import RequestBudget


def element_count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_shape(name: str, shape: Any) -> list[int]:
    if type(shape) is list:  # the JSON/protobuf case: one loop instead of two generators
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidArgument(f"input '{name}': shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input '{name}': shape {shape} has a negative dimension")
    return shape


def deserialize_bytes_tensor(
    buf: bytes | memoryview, count: int, name: str, budget: RequestBudget | None = None
) -> np.ndarray:
    """BYTES elements as Triton sends them: 4-byte little-endian length, then the bytes."""
    mv = memoryview(buf)
    if count * 4 > len(mv):  # every element needs its 4-byte length: refuse before allocating
        raise InvalidArgument(f"input '{name}': BYTES data holds fewer than {count} elements")
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(mv):
            raise InvalidArgument(f"input '{name}': BYTES data holds fewer than {count} elements")
        (length,) = struct.unpack_from("<I", mv, offset)
        offset += 4
        if budget is not None:
            budget.check_bytes_element(name, i, length)
        if offset + length > len(mv):
            raise InvalidArgument(f"input '{name}': BYTES element {i} runs past the end of the data")
        out[i] = bytes(mv[offset : offset + length])
        offset += length
    if offset != len(mv):
        raise InvalidArgument(f"input '{name}': {len(mv) - offset} trailing bytes after {count} BYTES elements")
    return out


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    parts = []
    for item in array.ravel():
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def from_raw(
    name: str, datatype: str, shape: list[int], raw: bytes | memoryview, budget: RequestBudget | None = None
) -> np.ndarray:
    """A tensor from its raw little-endian bytes (zero copy for fixed-size types).

    ``np.ndarray(shape, dtype, buffer)`` builds the view in one call, several times faster than
    ``np.frombuffer(...).reshape(shape)`` (same flags, same errors).
    """
    dt = datatypes.from_v2(datatype)
    count = element_count(shape)
    if dt.v2 == "BYTES":
        return deserialize_bytes_tensor(raw, count, name, budget).reshape(shape)
    if dt.numpy is None:
        raise InvalidArgument(f"input '{name}': datatype {datatype} is not supported by this server")
    expected = count * dt.itemsize
    if len(raw) != expected:
        raise InvalidArgument(
            f"unexpected total byte size {len(raw)} for input '{name}', expecting {expected} "
            f"for shape {shape} of {datatype}"
        )
    array: np.ndarray = np.ndarray(shape, datatypes.WIRE_NUMPY[dt.v2], raw)
    return array


#: dtypes whose C-contiguous array is already its own wire bytes (little-endian, plain buffer format)
_RAW_AS_IS = {dt for dt in datatypes.WIRE_NUMPY.values() if dt.kind != "V"}


#: below this many bytes a copy (``tobytes``) is cheaper than a memoryview (``data.cast``)
_COPY_BELOW = 1024


def to_raw(array: np.ndarray) -> bytes | memoryview:
    if array.dtype in _RAW_AS_IS:  # every fixed-size output: no ascontiguousarray/byte-order work
        if array.nbytes < _COPY_BELOW:
            return array.tobytes()
        if array.flags.c_contiguous and array.ndim:
            return array.data.cast("B")
    if array.dtype == np.object_:
        return serialize_bytes_tensor(array)
    a = np.ascontiguousarray(array)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.dtype.kind == "V":  # ml_dtypes' bfloat16: no buffer-protocol format, same bytes as uint16
        a = a.view(f"u{a.dtype.itemsize}")
    return a.data.cast("B")


def _flatten(data: Any) -> list[Any]:
    if isinstance(data, list) and data and isinstance(data[0], list):
        flat: list[Any] = []
        stack = [data]
        # iterative flatten keeps deep nesting from hitting the recursion limit
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(reversed(item))
            else:
                flat.append(item)
        return flat
    return data if isinstance(data, list) else [data]


def from_list(name: str, datatype: str, shape: list[int], data: Any, budget: RequestBudget | None = None) -> np.ndarray:
    """A tensor from JSON/typed values (flat or nested; BYTES as strings)."""
    dt = datatypes.from_v2(datatype)
    flat = _flatten(data)
    count = element_count(shape)
    if len(flat) != count:
        raise InvalidArgument(f"input '{name}' has {len(flat)} elements in its data but shape {shape} needs {count}")
    if dt.v2 == "BYTES":
        out = np.empty(count, dtype=object)
        for i, v in enumerate(flat):
            if isinstance(v, str):
                out[i] = v.encode("utf-8")
            elif isinstance(v, (bytes, bytearray)):
                out[i] = bytes(v)
            else:
                raise InvalidArgument(f"input '{name}': BYTES elements must be strings, got {type(v).__name__}")
            if budget is not None:
                budget.check_bytes_element(name, i, len(out[i]))
        return out.reshape(shape)
    if dt.numpy is None:
        raise InvalidArgument(f"input '{name}': datatype {datatype} is not supported by this server")
    if dt.v2 == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise InvalidArgument(f"input '{name}': BOOL data must be true/false")
    elif dt.numpy.kind in "iu":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raise InvalidArgument(f"input '{name}': {datatype} data must be integers")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise InvalidArgument(f"input '{name}': {datatype} data must be numbers")
    try:
        # a finite JSON number that only fits as infinity (70000 as FP16, 1e39 as FP32) is out of range too
        with np.errstate(over="raise"):
            return np.asarray(flat, dtype=dt.numpy).reshape(shape)
    except (OverflowError, ValueError, FloatingPointError) as exc:
        raise InvalidArgument(f"input '{name}': data does not fit {datatype}: {exc}") from None


def to_list(array: np.ndarray) -> list[Any]:
    if array.dtype == np.object_:
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.ravel()]
    values: list[Any] = array.ravel().tolist()
    return values


def v2_datatype(array: np.ndarray) -> str:
    return datatypes.from_numpy(array.dtype).v2


#: the gRPC ``InferTensorContents`` field that carries each datatype's typed values (FP16/BF16: raw only)
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def from_typed(
    name: str, datatype: str, shape: list[int], values: Any, budget: RequestBudget | None = None
) -> np.ndarray:
    """A tensor from the already-typed values of one wire field (gRPC ``contents``).

    Narrow integer types travel in 32-bit fields, so their range is checked here.
    """
    dt = datatypes.from_v2(datatype)
    count = element_count(shape)
    if len(values) != count:
        raise InvalidArgument(
            f"input '{name}' has {len(values)} elements in its contents but shape {shape} needs {count}"
        )
    if dt.v2 == "BYTES":
        out = np.empty(count, dtype=object)
        for i, v in enumerate(values):
            if budget is not None:
                budget.check_bytes_element(name, i, len(v))
            out[i] = bytes(v)
        return out.reshape(shape)
    if dt.numpy is None or dt.v2 == "BF16":
        raise InvalidArgument(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    if dt.numpy.kind in "iu" and dt.itemsize < 4:
        wide = np.asarray(values, dtype=np.int64)
        info = np.iinfo(dt.numpy)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidArgument(f"input '{name}': contents do not fit {datatype}")
        return wide.astype(dt.numpy).reshape(shape)
    return np.asarray(values, dtype=dt.numpy).reshape(shape)
