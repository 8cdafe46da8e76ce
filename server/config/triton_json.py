"""A ModelConfig as Triton writes it in JSON, byte for byte (core ``ModelConfigToJson``).

``GET /v2/models/{m}/config`` answers exactly this text and the Python backend's
``initialize(args)["model_config"]`` is the same string (seen with Triton 2.51: both are equal). Triton
prints the message with protobuf's C++ JSON printer (proto field names, fields without presence always
printed), parses it into rapidjson, turns the 64-bit integers it knows into numbers and writes it out
again compactly. What that pipeline does, and this module repeats:

* fields in declaration order, except a set scalar member of a real ``oneof`` (``initial_state``'s
  ``zero_data``/``data_file``, warm-up inputs' data choice) which comes after its message's other fields;
  unset messages are left out, unset scalars and empty lists/maps are printed;
* 64-bit integers as numbers, except the ones core forgets: ``sequence_batching.state.initial_state.dims``
  (its fix-up looks for ``initial_state`` in the wrong object), the CUDA graph shapes and
  ``secondary_devices.device_id`` stay JSON strings;
* floats as protobuf prints them (``%.6g``, else ``%.9g`` for float; 15/17 digits for double), re-read by
  rapidjson: an integral value printed without exponent becomes an integer (``0``, ``1``), anything else
  a double written by rapidjson's shortest form (``0.25``, ``100000000000000000000.0``, ``1e-7``);
* map entries in key order (Triton's are in its hash map's order, which changes from process to process);
* strings as rapidjson escapes them (``"``, ``\\`` and control characters; UTF-8 kept).
"""

from __future__ import annotations

import base64
import json
import math
import struct
from decimal import Decimal
from typing import Any

from google.protobuf import descriptor
from google.protobuf.message import Message

from . import model_config_pb2 as pb
from .codec import MODEL_CONFIG

_FD = descriptor.FieldDescriptor
_INT64 = {_FD.TYPE_INT64, _FD.TYPE_UINT64, _FD.TYPE_SINT64, _FD.TYPE_FIXED64, _FD.TYPE_SFIXED64}
#: 64-bit fields core's ModelConfigToJson leaves as strings (paths of field names from ModelConfig)
_INT64_AS_STRING = {
    ("sequence_batching", "state", "initial_state", "dims"),
    ("optimization", "cuda", "graph_spec", "input", "value", "dim"),
    ("optimization", "cuda", "graph_spec", "graph_lower_bound", "input", "value", "dim"),
    ("instance_group", "secondary_devices", "device_id"),
}
#: fields newer than Triton 2.51 (absent from its schema): printed only when set
_NEWER_THAN_2_51 = {("ensemble_scheduling", "max_inflight_requests")}


def config_to_triton_json(config: pb.ModelConfig) -> str:
    """The compact JSON text Triton answers for ``config`` ("" for an empty config, as Triton)."""
    if config.ByteSize() == 0:
        return ""
    return _message(config, MODEL_CONFIG, ())


def _message(msg: Message, desc: descriptor.Descriptor, path: tuple[str, ...]) -> str:
    parts: list[str] = []
    trailing: list[str] = []  # set scalar oneof members: after the other fields (protobuf C++'s order)
    for fd in desc.fields:
        where = (*path, fd.name)
        value = getattr(msg, fd.name)
        oneof = fd.containing_oneof
        real_oneof = oneof is not None and not (len(oneof.fields) == 1 and oneof.name == "_" + fd.name)
        if fd.label == _FD.LABEL_REPEATED:
            text = _repeated(fd, value, where)
        elif fd.message_type is not None:
            if not msg.HasField(fd.name):
                continue
            text = _message(value, fd.message_type, where)
        elif real_oneof:
            if not msg.HasField(fd.name):
                continue
            trailing.append(f"{_string(fd.name)}:{_scalar(fd, value, where)}")
            continue
        else:
            if where in _NEWER_THAN_2_51 and not value:
                continue
            text = _scalar(fd, value, where)
        parts.append(f"{_string(fd.name)}:{text}")
    return "{" + ",".join(parts + trailing) + "}"


def _repeated(fd: descriptor.FieldDescriptor, value: Any, where: tuple[str, ...]) -> str:
    entry = fd.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key_fd = entry.fields_by_name["key"]
        value_fd = entry.fields_by_name["value"]
        items = []
        for key in sorted(value):  # Triton's order is its hash map's, different in every process
            item = value[key]
            if value_fd.message_type is not None:
                text = _message(item, value_fd.message_type, (*where, "value"))
            else:
                text = _scalar(value_fd, item, (*where, "value"))
            key_text = str(key).lower() if key_fd.type == _FD.TYPE_BOOL else str(key)
            items.append(f"{_string(key_text)}:{text}")
        return "{" + ",".join(items) + "}"
    if entry is not None:
        return "[" + ",".join(_message(v, entry, where) for v in value) + "]"
    return "[" + ",".join(_scalar(fd, v, where) for v in value) + "]"


def _scalar(fd: descriptor.FieldDescriptor, value: Any, where: tuple[str, ...]) -> str:
    if fd.type == _FD.TYPE_ENUM:
        enum_value = fd.enum_type.values_by_number.get(value)
        return _string(enum_value.name) if enum_value is not None else str(value)
    if fd.type == _FD.TYPE_BOOL:
        return "true" if value else "false"
    if fd.type == _FD.TYPE_STRING:
        return _string(value)
    if fd.type == _FD.TYPE_BYTES:
        return _string(base64.b64encode(value).decode())
    if fd.type in _INT64:
        return _string(str(value)) if where in _INT64_AS_STRING else str(value)
    if fd.type in (_FD.TYPE_FLOAT, _FD.TYPE_DOUBLE):
        return _float(float(value), single=fd.type == _FD.TYPE_FLOAT)
    return str(value)


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _float(value: float, single: bool) -> str:
    """protobuf C++ ``SimpleFtoa``/``SimpleDtoa`` text, re-read and re-written by rapidjson."""
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if single:
        text = f"{value:.6g}"
        if _single(float(text)) != _single(value):
            text = f"{value:.9g}"
    else:
        text = f"{value:.15g}"
        if float(text) != value:
            text = f"{value:.17g}"
    if not any(c in text for c in ".eEn"):
        return str(int(text))  # rapidjson reads an integer and writes it back as one
    return _rapidjson_double(float(text))


def _rapidjson_double(value: float) -> str:
    """rapidjson ``Writer::WriteDouble``: the shortest digits (Grisu) laid out by its ``Prettify``."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    exact = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, exact.digits))
    k = int(exact.exponent)  # value = digits x 10^k
    kk = len(digits) + k  # 10^(kk-1) <= value < 10^kk
    if 0 <= k and kk <= 21:
        out = digits + "0" * k + ".0"
    elif 0 < kk <= 21:
        out = digits[:kk] + "." + digits[kk:]
    elif -6 < kk <= 0:
        out = "0." + "0" * -kk + digits
    elif len(digits) == 1:
        out = f"{digits}e{kk - 1}"
    else:
        out = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + out


def _single(value: float) -> float:
    """``value`` rounded to float32, as a float field holds it."""
    try:
        rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.inf
    return rounded
