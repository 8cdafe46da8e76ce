"""One table for tensor data types: KServe v2 names, config enum names and numpy dtypes."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import InvalidArgument


@dataclass(frozen=True)
class DataType:
    v2: str  # KServe v2 / Triton wire name, e.g. "FP32"
    config: str  # config.pbtxt enum name, e.g. "TYPE_FP32"
    numpy: np.dtype | None  # None: no numpy equivalent
    itemsize: int  # bytes per element; 0 for variable-size BYTES


_TABLE = [
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), 1),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), 2),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), 4),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), 8),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), 1),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), 2),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), 4),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), 8),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), 2),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), 4),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), 8),
    DataType("BYTES", "TYPE_STRING", np.dtype(np.object_), 0),
    # numpy has no bfloat16: ml_dtypes' is the one tritonclient sends and reads (and onnx depends on)
    DataType("BF16", "TYPE_BF16", np.dtype(ml_dtypes.bfloat16), 2),
]

BY_V2 = {t.v2: t for t in _TABLE}
BY_CONFIG = {t.config: t for t in _TABLE}
_BY_NUMPY = {t.numpy: t for t in _TABLE if t.numpy is not None}
#: each fixed-size type's little-endian dtype, the byte order on the wire, built once
#: (``dtype.newbyteorder`` per tensor showed on the binary hot path)
WIRE_NUMPY = {t.v2: t.numpy.newbyteorder("<") for t in _TABLE if t.numpy is not None and t.itemsize}


def from_v2(name: str) -> DataType:
    try:
        return BY_V2[name]
    except KeyError:
        raise InvalidArgument(f"invalid datatype '{name}': expected one of {', '.join(BY_V2)}") from None


def from_config(name: str) -> DataType:
    return BY_CONFIG[name]


def from_numpy(dtype: np.dtype) -> DataType:
    found = _BY_NUMPY.get(dtype) if isinstance(dtype, np.dtype) else None
    if found is not None:  # an array's own dtype, every output: skip np.dtype() and the kind test
        return found
    dtype = np.dtype(dtype)
    if dtype.kind in ("S", "U", "O"):
        return BY_V2["BYTES"]
    try:
        return _BY_NUMPY[dtype]
    except KeyError:
        raise InvalidArgument(f"unsupported numpy dtype {dtype}") from None


def v2_to_config(name: str) -> str:
    return from_v2(name).config


def config_to_v2(name: str) -> str:
    return BY_CONFIG[name].v2
