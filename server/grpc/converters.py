"""Protobuf messages ⇄ the core's types. Pure functions: no service calls, no gRPC context.

Outputs always travel as ``raw_output_contents`` (as Triton answers); inputs are accepted both as
``raw_input_contents`` (one entry per input, in order) and as typed ``contents``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from ..vocabulary import datatypes, tensors
from ..vocabulary.classification import classify
from ..vocabulary.errors import InvalidArgument
from ..vocabulary.limits import DEFAULT_LIMITS, Limits, RequestBudget
from ..vocabulary.types import InferenceRequest, InferenceResponse
from . import grpc_service_pb2 as pb


def param_value(param: Any) -> Any:
    """The Python value of an ``InferParameter`` / ``ModelRepositoryParameter`` (None when unset)."""
    kind = param.WhichOneof("parameter_choice")
    return getattr(param, kind) if kind else None


def _set_param(target: Any, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def request_from_pb(
    msg: pb.ModelInferRequest, limits: Limits = DEFAULT_LIMITS
) -> tuple[InferenceRequest, dict[str, int]]:
    """Returns the request and the classification count per requested output (0 = the tensor)."""
    budget = RequestBudget(limits)
    budget.check_input_count(len(msg.inputs))
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise InvalidArgument(
            f"expected {len(msg.inputs)} raw_input_contents entries (one per input) but got {len(raw)}"
        )
    inputs = {}
    for i, item in enumerate(msg.inputs):
        name = item.name
        if name in inputs:
            raise InvalidArgument(f"input '{name}' appears twice in the request")
        shape = tensors.check_shape(name, list(item.shape))
        budget.add_input(name, shape)
        if raw:
            if item.HasField("contents"):
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents for '{name}' "
                    f"for model '{msg.model_name}'"
                )
            inputs[name] = tensors.from_raw(name, item.datatype, shape, raw[i], budget)
        else:
            field = tensors.CONTENTS_FIELD.get(item.datatype)
            if field is None:
                datatypes.from_v2(item.datatype)  # an unknown name gets the same message as over HTTP
                raise InvalidArgument(
                    f"input '{name}': datatype '{item.datatype}' needs raw_input_contents (no typed contents field)"
                )
            inputs[name] = tensors.from_typed(name, item.datatype, shape, getattr(item.contents, field), budget)
    params = {k: param_value(v) for k, v in msg.parameters.items()}
    requested = None
    classification: dict[str, int] = {}
    if msg.outputs:
        requested = []
        for out in msg.outputs:
            requested.append(out.name)
            oparams = {k: param_value(v) for k, v in out.parameters.items()}
            classification[out.name] = tensors.int_parameter(oparams, "classification", f"output '{out.name}'") or 0
    request = InferenceRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        inputs=inputs,
        requested_outputs=requested,
        id=msg.id,
        parameters=params,
        priority=tensors.int_parameter(params, "priority", "request") or 0,
        timeout_us=tensors.int_parameter(params, "timeout", "request") or 0,
    )
    return request, classification


def response_to_pb(response: InferenceResponse, classification: dict[str, int]) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version, id=response.id)
    for key, value in response.parameters.items():
        _set_param(msg.parameters[key], value)
    for name, array in response.outputs.items():
        k = classification.get(name, 0)
        if k:
            array = classify(array, k, response.labels.get(name))
        msg.outputs.add(name=name, datatype=tensors.v2_datatype(array), shape=array.shape)
        msg.raw_output_contents.append(bytes(tensors.to_raw(array)))
    return msg


def metadata_to_pb(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    return json_format.ParseDict(meta, pb.ModelMetadataResponse())


def statistics_to_pb(stats: dict[str, Any]) -> pb.ModelStatisticsResponse:
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse())


_INDEX_FIELDS = ("name", "version", "state", "reason")


def index_to_pb(rows: list[dict[str, str]]) -> pb.RepositoryIndexResponse:
    msg = pb.RepositoryIndexResponse()
    for row in rows:
        # Triton's ModelIndex fields only (the HTTP rows may carry kubeinfer's config_digest)
        msg.models.add(**{k: v for k, v in row.items() if k in _INDEX_FIELDS})
    return msg
