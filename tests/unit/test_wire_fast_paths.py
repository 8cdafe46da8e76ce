"""The codec's fast paths (plain binary tensors, plain parameters) answer exactly as the general path does.

Each case is one the fast path must hand over to the general code: a layout, byte order or parameter
mix that only the general path knows how to treat.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np
import orjson
import pytest
from kubeinfer.server.http.codec import decode_request, encode_response
from kubeinfer.server.vocabulary import datatypes, tensors
from kubeinfer.server.vocabulary.errors import InvalidArgument
from kubeinfer.server.vocabulary.types import InferenceResponse


def _wire_bytes(array: np.ndarray) -> bytes:
    """What the wire carries, computed the slow, obvious way."""
    a = np.ascontiguousarray(array)
    if a.dtype.kind == "V":
        a = a.view(f"u{a.dtype.itemsize}")
    return a.astype(a.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize(
    "array",
    [
        np.arange(16, dtype=np.float32).reshape(1, 16),  # small: copied
        np.arange(4096, dtype=np.int64).reshape(64, 64),  # large: a view
        np.arange(4096, dtype=np.int64).reshape(64, 64).T,  # large, not contiguous
        np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],  # small, not contiguous
        np.float64(2.5).reshape(()),  # 0-d
        np.arange(6, dtype=">i4"),  # big-endian
        np.arange(600, dtype=">f8"),  # big-endian, large
        np.array([True, False, True]),
        np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16),
    ],
)
def test_to_raw_gives_the_little_endian_c_order_bytes(array: np.ndarray) -> None:
    assert bytes(tensors.to_raw(array)) == _wire_bytes(array)


@pytest.mark.parametrize("datatype", [d for d, t in datatypes.BY_V2.items() if t.itemsize])
def test_from_raw_reads_back_what_to_raw_wrote(datatype: str) -> None:
    dtype = datatypes.BY_V2[datatype].numpy
    assert dtype is not None
    original = np.arange(6).astype(dtype).reshape(2, 3)
    raw = bytes(tensors.to_raw(original))
    back = tensors.from_raw("x", datatype, [2, 3], raw)
    assert back.dtype == dtype and back.shape == (2, 3)
    assert bytes(tensors.to_raw(back)) == raw
    assert not back.flags.writeable  # a view of the request body, which nobody may change


def test_from_raw_over_writable_memory_stays_a_view_of_it() -> None:
    buf = bytearray(8)
    array = tensors.from_raw("x", "INT32", [2], memoryview(buf))
    buf[0] = 7
    assert array[0] == 7


def test_from_raw_refuses_a_size_that_does_not_match_the_shape() -> None:
    with pytest.raises(InvalidArgument, match="unexpected total byte size 12 for input 'x', expecting 16"):
        tensors.from_raw("x", "FP32", [4], b"\0" * 12)


class _Dim(enum.IntEnum):
    TWO = 2


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([1, True], "shape must be a list of integers, got [1, True]"),
        ([1, -2], "shape [1, -2] has a negative dimension"),
        ((1, 2), "shape must be a list of integers, got (1, 2)"),
        ([1, 2.0], "shape must be a list of integers, got [1, 2.0]"),
    ],
)
def test_check_shape_refusals_keep_their_text(shape: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        tensors.check_shape("x", shape)
    assert exc.value.message == f"input 'x': {message}"


def test_check_shape_still_takes_int_subclasses() -> None:
    assert tensors.check_shape("x", [_Dim.TWO, 3]) == [2, 3]


def _body(inputs: list[dict[str, object]], data: bytes, **header: object) -> tuple[bytes, str]:
    head = orjson.dumps({"inputs": inputs, **header})
    return head + data, str(len(head))


_FP32x2 = np.array([1.5, -2.0], dtype=np.float32).tobytes()


def _input(**params: object) -> dict[str, object]:
    return {"name": "A", "datatype": "FP32", "shape": [2], "parameters": params}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"binary_data_size": True},
            "input 'A': parameter 'binary_data_size' must be a non-negative integer, got True",
        ),
        ({"binary_data_size": -8}, "input 'A': parameter 'binary_data_size' must be a non-negative integer, got -8"),
        (
            {"binary_data_size": 8, "shared_memory_region": "r", "shared_memory_byte_size": 8},
            "input 'A' has shared-memory parameters and also binary_data_size; send its data one way",
        ),
        ({"binary_data_size": 8, "shared_memory_region": "r"}, "input 'A': 'shared_memory_byte_size' must be given"),
    ],
)
def test_binary_input_parameters_beyond_the_plain_size_are_still_checked(
    params: dict[str, object], message: str
) -> None:
    body, length = _body([_input(**params)], _FP32x2)
    with pytest.raises(InvalidArgument) as exc:
        decode_request(body, length, "m", "")
    assert exc.value.message.startswith(message)


def test_a_plain_binary_input_and_extra_parameters_decode_alike() -> None:
    plain, length = _body([_input(binary_data_size=8)], _FP32x2)
    extra, extra_length = _body([_input(binary_data_size=8, note="kept out of the tensor")], _FP32x2)
    for body, hl in ((plain, length), (extra, extra_length)):
        request, _ = decode_request(body, hl, "m", "")
        assert request.inputs["A"].tolist() == [1.5, -2.0]


def test_request_parameters_lose_only_binary_data_output() -> None:
    body, length = _body([_input(binary_data_size=8)], _FP32x2, parameters={"binary_data_output": True, "x": 1})
    request, options = decode_request(body, length, "m", "")
    assert request.parameters == {"x": 1}
    assert options["__default_binary__"] is True
    body, length = _body([_input(binary_data_size=8)], _FP32x2, parameters={"priority": 2, "timeout": 5})
    request, _ = decode_request(body, length, "m", "")
    assert (request.parameters, request.priority, request.timeout_us) == ({"priority": 2, "timeout": 5}, 2, 5)


@pytest.mark.parametrize(
    ("oparams", "expected"),
    [
        ({"binary_data": True}, {"binary": True, "classification": 0, "shm": None}),
        ({}, {"binary": False, "classification": 0, "shm": None}),
        ({"binary_data": False, "classification": 2}, {"binary": False, "classification": 2, "shm": None}),
        ({"classification": None}, {"binary": False, "classification": 0, "shm": None}),
    ],
)
def test_output_options(oparams: dict[str, object], expected: dict[str, object]) -> None:
    body, length = _body([_input(binary_data_size=8)], _FP32x2, outputs=[{"name": "Y", "parameters": oparams}])
    _, options = decode_request(body, length, "m", "")
    assert options["Y"] == expected


def test_output_shared_memory_is_still_refused_without_a_registry() -> None:
    outputs = [{"name": "Y", "parameters": {"binary_data": True, "shared_memory_region": "r"}}]
    body, length = _body([_input(binary_data_size=8)], _FP32x2, outputs=outputs)
    with pytest.raises(InvalidArgument, match="output 'Y': 'shared_memory_byte_size' must be given"):
        decode_request(body, length, "m", "")


def test_unnamed_outputs_follow_the_default_binary_option() -> None:
    response = InferenceResponse("m", "1", {"Y": np.arange(3, dtype=np.int32)})
    body, json_length = encode_response(response, {"__default_binary__": True})
    assert json_length is not None and body[json_length:] == np.arange(3, dtype="<i4").tobytes()
    body, json_length = encode_response(response, {"__default_binary__": False})
    assert json_length is None and orjson.loads(body)["outputs"][0]["data"] == [0, 1, 2]
