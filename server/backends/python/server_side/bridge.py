"""Between the runtime's vocabulary and what a Python model sees: one home for both ways of running one.

* ``incoming_fields``: an incoming request as ``pb_utils.InferenceRequest`` presents it (Triton's
  correlation id, sequence flags, the parameters a model sees);
* ``outputs_or_error``: a model's response as the runtime's outputs or typed error;
* ``start_bls``: a BLS request, checked as pb_stub/request_executor.cc checks it (Triton's texts), then
  started through the registry, so it is scheduled (and batched) like any other request; one made with
  ``trace=request.trace()`` of a traced request starts as its child span (the registry's ``around_infer.bls``),
  which ``item_parts`` ends with the final response read (and a cancel of the stream ends too).

Server side only: the in-process host and the stub's server end (``stub_server``) both use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ....vocabulary import errors
from ....vocabulary.registry_view import EndSpan, RegistryView
from ....vocabulary.sequence import sequence_parameters
from ....vocabulary.streaming import ResponseStream, StreamItem
from ....vocabulary.types import InferenceRequest as CoreRequest

#: request parameters Triton's front ends consume themselves; a model never sees them
RESERVED_PARAMETERS = frozenset(
    {"priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output"}
)


def incoming_fields(core: CoreRequest, output_names: list[str], version: int) -> dict[str, Any]:
    """What ``pb_utils.InferenceRequest`` shows of ``core`` (inputs apart)."""
    params = core.parameters
    return {
        "id": core.id,
        "correlation_id": params.get("sequence_id", 0) or 0,
        "requested": core.requested_outputs if core.requested_outputs is not None else output_names,
        "model_name": core.model_name,
        "model_version": version,
        "flags": (1 if params.get("sequence_start") else 0) | (2 if params.get("sequence_end") else 0),
        "timeout": core.timeout_us,
        # the request's open model span when it is traced (0: not traced), for ``request.trace()``
        "trace": core.trace_id,
        "parameters": {
            k: v
            for k, v in params.items()
            if k not in RESERVED_PARAMETERS and not k.startswith("triton_") and isinstance(v, (str, int, float, bool))
        },
    }


def error_of(code: str, message: str) -> errors.ServerError:
    """A model's ``TritonError`` (code name and message) as the runtime's typed error."""
    return errors.error_for_code(code, message, "CANCELED" if code == "CANCELLED" else "BACKEND")


def outputs_or_error(
    tensors: Iterable[tuple[str, np.ndarray]], error: tuple[str, str] | None, wanted: frozenset[str] | None
) -> dict[str, np.ndarray] | errors.ServerError:
    """A response's tensors (pruned to the requested ones; BYTES elements as bytes) or its error."""
    if error is not None:
        return error_of(*error)
    outputs: dict[str, np.ndarray] = {}
    for name, array in tensors:
        if wanted is not None and name not in wanted:
            continue
        if array.dtype == np.object_ and array.size:
            array = np.vectorize(_to_bytes, otypes=[object])(array)
        outputs[name] = array
    return outputs


def _to_bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8")


class BlsRefused(Exception):
    """A BLS request refused before it was queued: Triton answers it with one INTERNAL error response."""


def start_bls(
    registry: RegistryView, fields: dict[str, Any], inputs: dict[str, np.ndarray], decoupled: bool
) -> tuple[ResponseStream, EndSpan | None]:
    """On the server loop: pb_stub/request_executor.cc's checks, then the request starts: its stream, and what ends
    its span when it is traced (hand it to ``item_parts``)."""
    name = fields["model_name"]
    version = fields["model_version"]
    try:
        if not registry.is_model_ready(name, version):
            raise errors.Unavailable(f"Failed for execute the inference request. Model '{name}' is not ready.")
        if not decoupled and registry.is_decoupled(name, version):
            raise errors.DecoupledModelCall(
                f"Model {name} is using the decoupled. The current BLS request call doesn't support models "
                "using the decoupled transaction policy. Please use 'decoupled=True' argument to the 'exec' "
                "or 'async_exec' calls for decoupled models.'"
            )
        # a BLS step of a sequence: its id and start/end flags travel as the sequence extension's parameters
        params = {**fields["parameters"], **sequence_parameters(fields["correlation_id"], fields["flags"])}
        core = CoreRequest(
            model_name=name,
            model_version=version,
            inputs=inputs,
            requested_outputs=fields["requested"],
            id=fields["id"],
            parameters=params,
            timeout_us=fields["timeout"],
        )
        parent = fields.get("trace", 0)
        around = registry.around_infer
        if not parent or around is None:
            return registry.infer_stream(core), None
        stream, end = around.bls(parent, core, registry.infer_stream)
        if end is not None:
            stream.on_cancel(lambda: end(None))
        return stream, end
    except errors.ServerError as exc:
        raise BlsRefused(f"Model {name} - Error when running inference: {exc.message}") from None


def item_parts(
    item: StreamItem, end: EndSpan | None = None
) -> tuple[dict[str, np.ndarray], dict[str, Any], tuple[str, str] | None]:
    """A callee's stream item as (outputs, parameters, error): a flag-only final has neither (Triton's
    iterator yields an empty response for it). The final item ends the request's span (``end``, when traced)."""
    if item.final and end is not None:
        end(item.response)
    if item.error is not None:
        return {}, {}, (errors.code_of(item.error), item.error.message)
    if item.response is None:
        return {}, {}, None
    return item.response.outputs, item.response.parameters or {}, None
