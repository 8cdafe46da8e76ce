"""Protobuf messages ⇄ the vocabulary's types. Pure functions: no service calls, no gRPC context.

Outputs always travel as ``raw_output_contents`` (as Triton answers); inputs are accepted both as
``raw_input_contents`` (one entry per input, in order) and as typed ``contents``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from ..sharedmemory import SharedMemoryRegistry, ShmRef, shm_ref
from ..sharedmemory.outputs import output_options, require
from ..vocabulary import datatypes, tensors
from ..vocabulary.classification import classify
from ..vocabulary.errors import InvalidArgument
from ..vocabulary.limits import DEFAULT_LIMITS, Limits, RequestBudget
from ..vocabulary.parameters import int_parameter
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


@dataclass(frozen=True)
class OutputOptions:
    """How one requested output travels back: top-k classification, or into a shared-memory region."""

    classification: int = 0
    shm: ShmRef | None = None


def _params(fields: Any) -> dict[str, Any]:
    """The plain values of a protobuf ``parameters`` map.

    An empty map (the usual case) answers {} at once: the map's ``items()`` is a Python-level view, costly
    once per tensor on the hot path.
    """
    return {k: param_value(v) for k, v in fields.items()} if fields else {}


def _input_ref(item: Any) -> ShmRef | None:
    fields = item.parameters
    return shm_ref(_params(fields), f"input '{item.name}'") if fields else None


def request_from_pb(
    msg: pb.ModelInferRequest, limits: Limits = DEFAULT_LIMITS, shm: SharedMemoryRegistry | None = None
) -> tuple[InferenceRequest, dict[str, OutputOptions]]:
    """Returns the request and the options of each requested output.

    ``raw_input_contents`` holds one entry per input that is not in shared memory, in input order
    (as tritonclient sends them and Triton reads them); shared-memory inputs are read through ``shm``.
    """
    budget = RequestBudget(limits)
    items = list(msg.inputs)  # walking the repeated field is not free: once, not twice
    budget.check_input_count(len(items))
    raw = msg.raw_input_contents
    refs = [_input_ref(item) for item in items]
    inline = refs.count(None)
    raw_count = len(raw)  # each use of the repeated field costs a lookup: read its length once
    if raw_count and raw_count != inline:
        raise InvalidArgument(
            f"expected {inline} raw_input_contents entries (one per input not in shared memory) but got {raw_count}"
        )
    inputs = {}
    next_raw = 0
    for item, ref in zip(items, refs, strict=True):
        name = item.name
        if name in inputs:
            raise InvalidArgument(f"input '{name}' appears twice in the request")
        shape = tensors.check_shape(name, item.shape[:])  # a list; cheaper than list(item.shape)
        budget.add_input(name, shape)
        if ref is not None:
            if item.HasField("contents"):
                raise InvalidArgument(
                    f"contents field must not be specified when using shared memory for '{name}' "
                    f"for model '{msg.model_name}'"
                )
            inputs[name] = require(shm).read_input(name, item.datatype, shape, ref, budget)
        elif raw_count:
            if item.HasField("contents"):
                raise InvalidArgument(
                    f"contents field must not be specified when using raw_input_contents for '{name}' "
                    f"for model '{msg.model_name}'"
                )
            inputs[name] = tensors.from_raw(name, item.datatype, shape, raw[next_raw], budget)
            next_raw += 1
        else:
            field = tensors.CONTENTS_FIELD.get(item.datatype)
            if field is None:
                datatypes.from_v2(item.datatype)  # an unknown name gets the same message as over HTTP
                raise InvalidArgument(
                    f"input '{name}': datatype '{item.datatype}' needs raw_input_contents (no typed contents field)"
                )
            inputs[name] = tensors.from_typed(name, item.datatype, shape, getattr(item.contents, field), budget)
    params = _params(msg.parameters)
    requested = None
    options: dict[str, OutputOptions] = {}
    if msg.outputs:
        requested = []
        for out in msg.outputs:
            requested.append(out.name)
            if not out.parameters:
                continue  # no classification, no shared memory: the default options
            oparams = _params(out.parameters)
            classification, oref = output_options(oparams, out.name, shm)
            options[out.name] = OutputOptions(classification, oref)
    request = InferenceRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        inputs=inputs,
        requested_outputs=requested,
        id=msg.id,
        parameters=params,
        priority=(int_parameter(params, "priority", "request") or 0) if params else 0,
        timeout_us=(int_parameter(params, "timeout", "request") or 0) if params else 0,
    )
    return request, options


_PLAIN = OutputOptions()


def response_to_pb(
    response: InferenceResponse, options: dict[str, OutputOptions], shm: SharedMemoryRegistry | None = None
) -> pb.ModelInferResponse:
    """Outputs as ``raw_output_contents``; one in shared memory is written there and gets an empty entry
    (Triton keeps one raw entry per output so that clients can index them)."""
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version, id=response.id)
    for key, value in response.parameters.items():
        _set_param(msg.parameters[key], value)
    for name, array in response.outputs.items():
        opt = options.get(name, _PLAIN)
        if opt.classification:
            array = classify(array, opt.classification, response.labels.get(name))
        msg.outputs.add(name=name, datatype=tensors.v2_datatype(array), shape=array.shape)
        if opt.shm is not None:
            require(shm).write_output(name, array, opt.shm)
            msg.raw_output_contents.append(b"")
        else:
            msg.raw_output_contents.append(bytes(tensors.to_raw(array)))
    return msg


def metadata_to_pb(meta: dict[str, Any]) -> pb.ModelMetadataResponse:
    return json_format.ParseDict(meta, pb.ModelMetadataResponse())


def statistics_to_pb(stats: dict[str, Any]) -> pb.ModelStatisticsResponse:
    # the HTTP rows' kubeinfer additions (the latency histogram) have no field in Triton's message
    return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)


_INDEX_FIELDS = ("name", "version", "state", "reason")


def index_to_pb(rows: list[dict[str, Any]]) -> pb.RepositoryIndexResponse:
    msg = pb.RepositoryIndexResponse()
    for row in rows:
        # Triton's ModelIndex fields only (the HTTP rows may carry kubeinfer's config_digest)
        msg.models.add(**{k: v for k, v in row.items() if k in _INDEX_FIELDS})
    return msg
