"""The operator's early ONNX check says what the server says when it loads the same config and file.

Each case is an InferenceModel spec and an ONNX file: the operator renders the spec and checks the file
(``check_onnx``); the server parses the rendered config.pbtxt, auto-completes and checks it
(``prepare_config``, what a load runs). Both must refuse with the same words, or both accept. The cases
are the ones where the two used to disagree (issue #38: the batch dimension, undeclared inputs, reshape).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.onnx_check import check_onnx
from kubeinfer.server.config import ConfigError, parse_config_text
from kubeinfer.server.examples import models
from kubeinfer.server.runtime.model import prepare_config
from onnx import TensorProto

from tests.support.models import unary

ADD_SUB = models.add_sub(16)  # INPUT0, INPUT1 -> OUTPUT0, OUTPUT1, FP32 [batch, 16]
FIXED = unary("fixed", "Relu", TensorProto.FLOAT, [1, 4])  # IN -> OUT, FP32 [1, 4]: no variable batch


def _tensor(name: str, dims: list[int], **more: Any) -> dict[str, Any]:
    return {"name": name, "dataType": "FP32", "dims": dims, **more}


CASES: dict[str, tuple[onnx.ModelProto, dict[str, Any], str | None]] = {
    # the operator used to accept a partial input list; the server refuses it
    "undeclared-input": (
        ADD_SUB,
        {"maxBatchSize": 8, "inputs": [_tensor("INPUT0", [16])]},
        "unable to load model 'm', configuration expects 1 inputs, model provides 2: the config lacks INPUT1",
    ),
    # the operator used to strip a fixed first dimension as the batch; the server refuses it
    "fixed-batch-dimension": (
        FIXED,
        {"maxBatchSize": 8, "inputs": [_tensor("IN", [4])], "outputs": [_tensor("OUT", [4])]},
        "input 'IN' has shape [1, 4] in the ONNX model, which has no variable batch dimension; "
        "set max_batch_size: 0 and dims: [1, 4]",
    ),
    # no maxBatchSize: the server auto-completes 4 from the batching graph; the operator used to check with 0
    "auto-completed-max-batch-size": (ADD_SUB, {"inputs": [_tensor("INPUT0", [16]), _tensor("INPUT1", [16])]}, None),
    "batch-dimension-in-dims": (
        ADD_SUB,
        {"maxBatchSize": 8, "inputs": [_tensor("INPUT0", [1, 16]), _tensor("INPUT1", [16])]},
        "input 'INPUT0' has dims [1, 16] in the config but [16] (without the batch dimension) in the ONNX model; "
        "dims must not include the batch dimension when max_batch_size > 0",
    ),
    # the server used to skip the dims check under a reshape; the model sees reshape.shape (Triton compares it)
    "reshape-contradicting-the-graph": (
        ADD_SUB,
        {
            "maxBatchSize": 8,
            "inputs": [_tensor("INPUT0", [4, 4], reshape={"shape": [2, 8]}), _tensor("INPUT1", [16])],
        },
        "input 'INPUT0' has reshape.shape [2, 8] in the config but [16] (without the batch dimension) in the "
        "ONNX model",
    ),
    "reshape-agreeing-with-the-graph": (
        ADD_SUB,
        {"maxBatchSize": 8, "inputs": [_tensor("INPUT0", [4, 4], reshape={"shape": [16]}), _tensor("INPUT1", [16])]},
        None,
    ),
    "wrong-type": (
        ADD_SUB,
        {"maxBatchSize": 8, "inputs": [_tensor("INPUT0", [16], dataType="INT32"), _tensor("INPUT1", [16])]},
        "input 'INPUT0' is TYPE_FP32 in the ONNX model but TYPE_INT32 in the config",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_operator_and_the_server_agree(tmp_path: Path, case: str) -> None:
    model, fields, expected = CASES[case]
    spec = {
        "server": "s",
        "platform": "onnxruntime_onnx",
        "versions": [{"version": 1, "source": {"path": "m.onnx"}}],
        **fields,
    }
    rendered = render_model("m", spec)
    version = tmp_path / "1"
    version.mkdir()
    onnx.save(model, str(version / "model.onnx"))

    operator_says = check_onnx(version / "model.onnx", rendered.config, 1)

    config = parse_config_text(rendered.config_text)
    try:
        prepare_config(config, version)
        server_says = None
    except ConfigError as exc:
        server_says = str(exc)

    assert server_says == expected
    assert operator_says[:1] == ([] if expected is None else [f"version 1: {expected}"])
