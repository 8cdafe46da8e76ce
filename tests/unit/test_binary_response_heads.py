"""encode_response answers a repeated all-binary response from its kept JSON header, byte for byte."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from kubeinfer.server.http import codec
from kubeinfer.server.http.codec import encode_response
from kubeinfer.server.vocabulary.types import InferenceResponse

BINARY = {"binary": True, "classification": 0, "shm": None}


@pytest.fixture(autouse=True)
def _fresh_table() -> None:
    codec.BINARY_HEADS.clear()


def _response(rows: int = 1, **kw: Any) -> InferenceResponse:
    outputs = {
        "OUTPUT0": np.arange(16 * rows, dtype=np.float32).reshape(rows, 16),
        "OUTPUT1": np.arange(rows, dtype=np.int64),
    }
    return InferenceResponse("add_sub", "1", outputs, **kw)


def _split(body: bytes, length: int | None) -> tuple[dict[str, Any], bytes]:
    assert length is not None
    return orjson.loads(body[:length]), body[length:]


@pytest.mark.parametrize(
    "options",
    [
        {"__default_binary__": False, "OUTPUT0": BINARY, "OUTPUT1": BINARY},
        {"__default_binary__": True},
        {"__default_binary__": True, "OUTPUT1": BINARY},
    ],
)
def test_a_kept_header_gives_the_same_body(options: dict[str, Any]) -> None:
    first = encode_response(_response(), options)
    assert len(codec.BINARY_HEADS) == 1
    assert encode_response(_response(), options) == first
    header, data = _split(*encode_response(_response(3), options))  # other shapes: their own header
    assert [o["shape"] for o in header["outputs"]] == [[3, 16], [3]]
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [192, 24]
    assert data == _response(3).outputs["OUTPUT0"].tobytes() + _response(3).outputs["OUTPUT1"].tobytes()
    assert len(codec.BINARY_HEADS) == 2


def test_same_header_other_values() -> None:
    options = {"__default_binary__": True}
    encode_response(_response(), options)
    other = _response()
    other.outputs["OUTPUT0"] = other.outputs["OUTPUT0"] + 1
    header, data = _split(*encode_response(other, options))
    assert header["model_name"] == "add_sub" and data[:64] == other.outputs["OUTPUT0"].tobytes()


@pytest.mark.parametrize(
    ("response", "options"),
    [
        (_response(id="call-1"), {"__default_binary__": True}),
        (_response(parameters={"sequence_id": 3}), {"__default_binary__": True}),
        (_response(), {"__default_binary__": False}),
        (_response(), {"__default_binary__": True, "OUTPUT0": {**BINARY, "binary": False}}),
        (_response(), {"__default_binary__": True, "OUTPUT0": {**BINARY, "classification": 1}}),
        (InferenceResponse("m", "1", {"S": np.array([b"ab"], dtype=object)}), {"__default_binary__": True}),
    ],
)
def test_responses_whose_header_is_not_decided_by_shapes_alone_are_not_kept(
    response: InferenceResponse, options: dict[str, Any]
) -> None:
    body = encode_response(response, options)
    assert len(codec.BINARY_HEADS) == 0
    assert encode_response(response, options) == body
