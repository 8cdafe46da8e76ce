"""RequestValidator's quick acceptance and check_outputs' quick pass never change a verdict or an error text.

``validate`` asks ``accepts`` first and runs the full ``check`` only when it says no; these tests feed both
a spread of good and bad requests and outputs and require the same outcome as the full check alone.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from kubeinfer.server.config import parse_config_text
from kubeinfer.server.runtime.validation import RequestValidator, _check_output, check_outputs
from kubeinfer.server.vocabulary.errors import BackendError, InvalidArgument
from kubeinfer.server.vocabulary.types import InferenceRequest

BATCHING = """
name: "m" max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_INT64 dims: [ -1, 2 ] },
        { name: "S" data_type: TYPE_STRING dims: [ 1 ] }, { name: "H" data_type: TYPE_BF16 dims: [ 2 ] optional: true } ]
output [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "Y" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
PLAIN = """
name: "p" max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
output [ { name: "X" data_type: TYPE_INT32 dims: [ 3 ] } ]
"""


def _outcome(call: Any) -> str:
    try:
        call()
    except (InvalidArgument, BackendError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _requests() -> list[tuple[str, InferenceRequest]]:
    def req(**inputs: Any) -> InferenceRequest:
        return InferenceRequest("m", inputs=inputs, id="r1")

    a = np.zeros((2, 4), np.float32)
    b = np.zeros((2, 3, 2), np.int64)
    s = np.array([[b"x"], [b"y"]], dtype=object)
    h = np.zeros((2, 2), ml_dtypes.bfloat16)
    cases = [
        ("good", req(A=a, B=b, S=s, H=h)),
        ("good without optional", req(A=a, B=b, S=s)),
        ("good, other order", req(S=s, H=h, B=b, A=a)),
        ("str bytes", req(A=a, B=b, S=np.array([[b"x"], [b"y"]], dtype="S1"), H=h)),
        ("big-endian", req(A=a.astype(">f4"), B=b, S=s, H=h)),
        ("wrong dtype", req(A=a.astype(np.float64), B=b, S=s, H=h)),
        ("wrong dims", req(A=np.zeros((2, 5), np.float32), B=b, S=s, H=h)),
        ("wrong rank", req(A=np.zeros((2, 4, 1), np.float32), B=b, S=s, H=h)),
        ("variable dim bad", req(A=a, B=np.zeros((2, 3, 3), np.int64), S=s, H=h)),
        ("variable dim rank", req(A=a, B=np.zeros((2, 3), np.int64), S=s, H=h)),
        ("no batch dim", req(A=np.zeros((), np.float32), B=b, S=s, H=h)),
        ("batch mismatch", req(A=np.zeros((3, 4), np.float32), B=b, S=s, H=h)),
        ("batch mismatch later", req(A=a, B=b, S=s, H=np.zeros((1, 2), ml_dtypes.bfloat16))),
        ("batch too big", req(A=np.zeros((9, 4), np.float32), B=np.zeros((9, 1, 2), np.int64), S=s, H=h)),
        ("batch zero", req(A=a[:0], B=b[:0], S=s[:0], H=h[:0])),
        ("missing", req(A=a, B=b, H=h)),
        ("unknown input", req(A=a, B=b, S=s, Z=a)),
        ("replaced input", req(A=a, B=b, H=h, Z=s)),
    ]
    asked = req(A=a, B=b, S=s, H=h)
    asked.requested_outputs = ["Y", "X"]
    unknown = req(A=a, B=b, S=s, H=h)
    unknown.requested_outputs = ["X", "Q"]
    return [*cases, ("outputs asked", asked), ("unknown output", unknown)]


@pytest.mark.parametrize("label,request_", _requests(), ids=[label for label, _ in _requests()])
def test_validate_says_what_the_full_check_says(label: str, request_: InferenceRequest) -> None:
    validator = RequestValidator(parse_config_text(BATCHING))
    full = _outcome(lambda: validator.check(request_))
    assert _outcome(lambda: validator.validate(request_)) == full
    if validator.accepts(request_):
        assert full == "ok", label
    elif label in ("good", "good, other order", "outputs asked"):
        pytest.fail(f"{label}: the quick check should accept it")
    assert (full == "ok") == (label.startswith("good") or label in ("str bytes", "outputs asked")), full


def test_validate_without_batching() -> None:
    validator = RequestValidator(parse_config_text(PLAIN))
    for array in (np.zeros((2, 7), np.float32), np.zeros((2,), np.float32), np.zeros((3, 1), np.float32)):
        request = InferenceRequest("p", inputs={"A": array})
        assert _outcome(lambda r=request: validator.validate(r)) == _outcome(lambda r=request: validator.check(r))
    assert validator.accepts(InferenceRequest("p", inputs={"A": np.zeros((2, 7), np.float32)}))


@pytest.mark.parametrize(
    "outputs",
    [
        {"X": np.zeros((2, 4), np.float32), "Y": np.array([[b"a"], [b"b"]], dtype=object)},
        {"X": np.zeros((2, 4), np.float32), "Y": np.array([["a"], ["b"]])},
        {"X": np.zeros((2, 4), np.float64)},
        {"X": np.zeros((2, 5), np.float32)},
        {"X": np.zeros((4,), np.float32)},
        {"X": np.zeros((), np.float32)},
        {"Y": np.zeros((2, 3, 1), dtype=object)},
        {"X": [1, 2], "other": np.zeros(1)},
    ],
)
def test_check_outputs_says_what_the_full_check_says(outputs: dict[str, Any]) -> None:
    validator = RequestValidator(parse_config_text(BATCHING))

    def full() -> None:
        for name, array in outputs.items():
            if isinstance(array, np.ndarray):
                _check_output(validator, name, array)

    assert _outcome(lambda: check_outputs(validator, outputs)) == _outcome(full)


def test_check_outputs_without_batching() -> None:
    validator = RequestValidator(parse_config_text(PLAIN))
    assert _outcome(lambda: check_outputs(validator, {"X": np.zeros(3, np.int32)})) == "ok"
    assert _outcome(lambda: check_outputs(validator, {"X": np.zeros((1, 3), np.int32)})) == (
        "BackendError: model 'p' returned output 'X' with shape [1, 3], but its configuration says [3]"
    )


def test_outputs_of_a_backend_that_does_not_check_them_pass_as_they_are() -> None:
    # Triton's python backend: the datatype and shape execute returned go out
    validator = RequestValidator(parse_config_text(PLAIN), checks_outputs=False)
    for array in (np.zeros((1, 3), np.int32), np.zeros(3, np.int64), np.zeros((2, 2, 2), np.float32)):
        assert _outcome(lambda array=array: check_outputs(validator, {"X": array})) == "ok"
    # the requests are still checked
    bad = InferenceRequest(model_name="p", inputs={"A": np.zeros((3, 1), np.int32)})
    assert _outcome(lambda: validator.validate(bad)).startswith("InvalidArgument")
