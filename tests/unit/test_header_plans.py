"""A header decoded again from its kept plan gives the same request as a fresh decode, and only then."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import orjson
import pytest
from kubeinfer.server.http import header_plans
from kubeinfer.server.http.codec import decode_request
from kubeinfer.server.vocabulary.errors import InvalidArgument, Unsupported
from kubeinfer.server.vocabulary.limits import DEFAULT_LIMITS, Limits
from kubeinfer.server.vocabulary.types import InferenceRequest

A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.arange(16, 32, dtype=np.float32).reshape(1, 16)


def _binary(**header: object) -> tuple[bytes, str]:
    """tritonclient's add_sub request: two binary FP32 [1,16] inputs."""
    inputs = [
        {"name": n, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
        for n in ("INPUT0", "INPUT1")
    ]
    head = orjson.dumps({"inputs": inputs, **header})
    return head + A.tobytes() + B.tobytes(), str(len(head))


Decoded = tuple[InferenceRequest, dict[str, Any]]


def _same(first: Decoded, second: Decoded) -> None:
    (r1, o1), (r2, o2) = first, second
    assert o1 == o2 and o1 is not o2
    for f in dataclasses.fields(r1):
        if f.name in ("inputs", "received_ns"):
            continue
        assert getattr(r1, f.name) == getattr(r2, f.name), f.name
    assert r1.parameters is not r2.parameters
    assert list(r1.inputs) == list(r2.inputs)
    for name, a1 in r1.inputs.items():
        a2 = r2.inputs[name]
        assert (a1.dtype, a1.shape, a1.flags.writeable) == (a2.dtype, a2.shape, a2.flags.writeable)
        assert np.array_equal(a1, a2)


@pytest.fixture(autouse=True)
def _fresh_table() -> None:
    header_plans.PLANS.clear()


@pytest.mark.parametrize(
    "header",
    [
        {"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]},
        {"outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]},
        {"parameters": {"binary_data_output": True}},
        {},
    ],
)
def test_a_kept_header_decodes_to_the_same_request(header: dict[str, object]) -> None:
    body, length = _binary(**header)
    first = decode_request(body, length, "add_sub", "1")
    assert header_plans.lookup(body[: int(length)], len(body), DEFAULT_LIMITS) is not None  # kept
    second = decode_request(body, length, "add_sub", "1")
    _same(first, second)
    other = body[: int(length)] + B.tobytes() + A.tobytes()  # same header, other tensors
    request, _ = decode_request(other, length, "add_sub", "1")
    assert np.array_equal(request.inputs["INPUT0"], B) and np.array_equal(request.inputs["INPUT1"], A)


@pytest.mark.parametrize(
    "header",
    [
        {"id": "call-1"},
        {"parameters": {"sequence_id": 7}},
        {"outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}}]},
    ],
)
def test_headers_that_change_per_call_or_need_the_registry_are_not_kept(header: dict[str, object]) -> None:
    body, length = _binary(**header)
    if "outputs" in header:  # the shared-memory output: refused without a registry, and not kept
        with pytest.raises(Unsupported, match="^client shared memory is disabled on this server"):
            decode_request(body, length, "add_sub", "1")
    else:
        request, _ = decode_request(body, length, "add_sub", "1")
        assert request.id == header.get("id", "") and request.parameters == header.get("parameters", {})
    assert header_plans.lookup(body[: int(length)], len(body), DEFAULT_LIMITS) is None
    assert len(header_plans.PLANS) == 0


def test_json_and_bytes_inputs_are_not_kept() -> None:
    head = orjson.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}]})
    request, _ = decode_request(head, None, "m", "")
    assert request.inputs["X"].tolist() == [1, 2]
    raw = b"\x05\0\0\0hello"
    head = orjson.dumps(
        {"inputs": [{"name": "S", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}]}
    )
    request, _ = decode_request(head + raw, str(len(head)), "m", "")
    assert request.inputs["S"].tolist() == [b"hello"]
    assert len(header_plans.PLANS) == 0


def test_a_body_of_another_length_gets_the_full_checks_and_their_text() -> None:
    body, length = _binary()
    decode_request(body, length, "add_sub", "1")
    with pytest.raises(InvalidArgument) as short:
        decode_request(body[:-4], length, "add_sub", "1")
    assert short.value.message == (
        "input 'INPUT1' declares binary_data_size 64 but only 60 bytes of binary data remain in the request body"
    )
    with pytest.raises(InvalidArgument) as long:
        decode_request(body + b"xx", length, "add_sub", "1")
    assert long.value.message == "the request body has 2 bytes beyond its declared tensors"


def test_a_plan_is_used_only_under_the_limits_it_was_checked_against() -> None:
    body, length = _binary()
    decode_request(body, length, "add_sub", "1")
    tight = Limits(max_tensor_elements=8)
    with pytest.raises(InvalidArgument, match="--max-tensor-elements"):
        decode_request(body, length, "add_sub", "1", tight)
    request, _ = decode_request(body, length, "add_sub", "1", DEFAULT_LIMITS)
    assert np.array_equal(request.inputs["INPUT0"], A) and np.array_equal(request.inputs["INPUT1"], B)


def test_the_table_keeps_at_most_its_capacity_and_drops_the_oldest() -> None:
    heads = []
    for rows in range(header_plans.CAPACITY + 10):
        head = orjson.dumps(
            {"inputs": [{"name": "X", "shape": [rows], "datatype": "INT8", "parameters": {"binary_data_size": rows}}]}
        )
        request, _ = decode_request(head + bytes(rows), str(len(head)), "m", "")
        assert request.inputs["X"].shape == (rows,)
        heads.append(head)
    assert len(header_plans.PLANS) == header_plans.CAPACITY
    kept = [header_plans.lookup(h, len(h) + rows, DEFAULT_LIMITS) is not None for rows, h in enumerate(heads)]
    assert kept == [False] * 10 + [True] * header_plans.CAPACITY
