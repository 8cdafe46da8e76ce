"""RequestBudget and the size checks in tensor decoding: refused before anything is allocated."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from kubeinfer.server.vocabulary import datatypes, tensors
from kubeinfer.server.vocabulary.errors import InvalidArgument
from kubeinfer.server.vocabulary.limits import MAX_EMPTY_SPAN, Limits, RequestBudget, body_too_large

SMALL = Limits(max_tensor_elements=100, max_request_elements=150, max_bytes_element_size=8, max_inputs=2)


def test_elements_are_counted_per_tensor_and_per_request() -> None:
    budget = RequestBudget(SMALL)
    assert budget.add_input("a", [10, 10]) == 100
    with pytest.raises(InvalidArgument, match="more than 150 elements together.*--max-request-elements"):
        budget.add_input("b", [51])


@pytest.mark.parametrize("shape", [[101], [2**62, 2**62], [10**18, 10**18, 10**18]])
def test_oversized_shapes_are_refused_without_computing_the_whole_product(shape: list[int]) -> None:
    with pytest.raises(InvalidArgument, match="the limit per tensor \\(--max-tensor-elements\\)"):
        RequestBudget(SMALL).add_input("x", shape)


def test_an_empty_dimension_makes_an_empty_tensor_whatever_the_others() -> None:
    assert RequestBudget(SMALL).add_input("x", [2**40, 0]) == 0
    # but numpy must be able to shape it (fuzzing found [0, 3e9, 3e9] raising "array is too big": a 500)
    with pytest.raises(InvalidArgument, match="cannot be represented"):
        RequestBudget(SMALL).add_input("x", [0, 3036988439, 3037012561])


@pytest.mark.parametrize("dtype", sorted(datatypes.BY_V2), ids=str)
def test_every_empty_shape_let_through_can_be_made_by_numpy_for_every_datatype(dtype: str) -> None:
    """The span limit holds for the widest elements too (2**60 let INT64/FP64/BYTES [0, 2**60] through to
    numpy's "array is too big": a 500)."""
    numpy_type = datatypes.from_v2(dtype).numpy
    assert numpy_type is not None
    for shape in ([0, MAX_EMPTY_SPAN], [MAX_EMPTY_SPAN // 2**20, 0, 2**20], [2**28, 2**28, 0]):
        assert RequestBudget(SMALL).add_input("x", shape) == 0
        assert np.empty(shape, numpy_type).size == 0
    with pytest.raises(InvalidArgument, match="cannot be represented"):
        RequestBudget(SMALL).add_input("x", [0, MAX_EMPTY_SPAN + 1])
    with pytest.raises(InvalidArgument, match="cannot be represented"):
        RequestBudget(SMALL).add_input("x", [0, 2**60])


def test_inputs_are_counted() -> None:
    budget = RequestBudget(SMALL)
    budget.add_input("a", [1])
    budget.add_input("b", [1])
    with pytest.raises(InvalidArgument, match="3 inputs, over the limit of 2 \\(--max-inputs\\)"):
        budget.add_input("c", [1])


def test_bytes_elements_are_refused_from_their_declared_length() -> None:
    raw = struct.pack("<I", 9) + b"123456789"
    with pytest.raises(InvalidArgument, match="BYTES element 0 is 9 bytes, over the limit of 8"):
        tensors.from_raw("s", "BYTES", [1], raw, RequestBudget(SMALL))
    with pytest.raises(InvalidArgument, match="--max-bytes-element-size"):
        tensors.from_list("s", "BYTES", [1], ["123456789"], RequestBudget(SMALL))
    with pytest.raises(InvalidArgument, match="--max-bytes-element-size"):
        tensors.from_typed("s", "BYTES", [1], [b"123456789"], RequestBudget(SMALL))
    assert (
        tensors.from_raw("s", "BYTES", [1], struct.pack("<I", 8) + b"12345678", RequestBudget(SMALL))[0] == b"12345678"
    )


def test_a_bytes_count_the_data_cannot_hold_is_refused_before_allocating() -> None:
    """10^12 object slots would be 8 TB: the 4-byte length prefixes alone rule it out."""
    with pytest.raises(InvalidArgument, match="holds fewer than 1000000000000 elements"):
        tensors.deserialize_bytes_tensor(b"\x00" * 16, 10**12, "s")


def test_the_body_message_is_tritons() -> None:
    err = body_too_large(100, 64)
    assert err.http_status == 413 and err.grpc_code == "RESOURCE_EXHAUSTED"
    assert err.message == (
        "Request size of 100 bytes exceeds the maximum allowed value of 64 bytes. "
        "Use --http-max-input-size to increase the limit."
    )


@pytest.mark.parametrize(("datatype", "value"), [("FP16", 70000.0), ("FP32", 1e39), ("INT8", 300), ("UINT8", -1)])
def test_numbers_out_of_range_for_the_datatype_are_refused(datatype: str, value: float) -> None:
    with pytest.raises(InvalidArgument, match=f"data does not fit {datatype}"):
        tensors.from_list("x", datatype, [1], [value])
