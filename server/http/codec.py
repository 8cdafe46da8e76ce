"""HTTP body ⇄ InferenceRequest/Response, including the binary tensor data extension.

The JSON header is parsed with orjson; binary tensors are numpy views into the request body (no
copy). No pydantic models on this path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ..sharedmemory import SharedMemoryRegistry, shm_ref
from ..sharedmemory.outputs import output_options, require
from ..vocabulary import tensors
from ..vocabulary.classification import classify
from ..vocabulary.errors import InvalidArgument
from ..vocabulary.limits import DEFAULT_LIMITS, Limits, RequestBudget
from ..vocabulary.parameters import int_parameter
from ..vocabulary.types import InferenceRequest, InferenceResponse
from . import header_plans, json_body

HEADER_LENGTH = "inference-header-content-length"


def error_body(message: str) -> bytes:
    """The v2 error shape every HTTP route answers with."""
    return orjson.dumps({"error": message})


def decode_request(
    body: bytes,
    header_length: str | None,
    model_name: str,
    model_version: str,
    limits: Limits = DEFAULT_LIMITS,
    shm: SharedMemoryRegistry | None = None,
) -> tuple[InferenceRequest, dict[str, Any]]:
    """Returns the request and per-output wire options (binary_data, classification, shared memory).

    Tensors in shared memory (``shared_memory_region`` parameters) are read through ``shm``; without a
    registry such parameters are refused.

    Each check runs, but through fast paths for the usual shapes of ``parameters``; a header decoded
    before is not decoded again (``header_plans``). What that saves: README 'Performance against Triton and MLServer'.
    """
    if header_length is not None:
        try:
            json_len = int(header_length)
        except ValueError:
            raise InvalidArgument(f"Inference-Header-Content-Length '{header_length}' is not an integer") from None
        if json_len < 0 or json_len > len(body):
            raise InvalidArgument(
                f"Inference-Header-Content-Length {json_len} is larger than the request body ({len(body)} bytes)"
            )
    else:
        json_len = len(body)
    head = body[:json_len]
    plan = header_plans.lookup(head, len(body), limits)
    if plan is not None:
        return plan.request(body, json_len, model_name, model_version)
    header = json_body.parse(head)
    if not isinstance(header, dict):
        raise InvalidArgument("the request body must be a JSON object")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidArgument("the request must have an 'inputs' list")
    params = header.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidArgument("'parameters' must be an object")
    if params and any(k.startswith("triton_") for k in params):  # Triton's http_server.cc ParseJsonTritonParams
        raise InvalidArgument(
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
        )
    budget = RequestBudget(limits)
    budget.check_input_count(len(raw_inputs))
    binary = memoryview(body)
    offset = json_len
    inputs: dict[str, np.ndarray] = {}
    for item in raw_inputs:
        offset = _decode_input(item, inputs, body, binary, offset, budget, shm)
    if offset != len(body):
        raise InvalidArgument(f"the request body has {len(body) - offset} bytes beyond its declared tensors")
    binary_default = bool(params.get("binary_data_output", False))
    options: dict[str, Any] = {"__default_binary__": binary_default}
    requested: list[str] | None = None
    raw_outputs = header.get("outputs")
    if raw_outputs is not None and not isinstance(raw_outputs, list):
        raise InvalidArgument("'outputs' must be a list")
    if raw_outputs:  # an empty list asks for nothing in particular: every output, as when it is left out
        requested = []
        for out in raw_outputs:
            requested.append(_decode_output(out, options, binary_default, shm))
    request_id = header.get("id", "")
    request = InferenceRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        requested_outputs=requested,
        id=request_id if isinstance(request_id, str) else str(request_id),
        # nothing to strip (the usual case): the freshly parsed dict is the request's own
        parameters={k: v for k, v in params.items() if k != "binary_data_output"}
        if "binary_data_output" in params
        else params,
        priority=(int_parameter(params, "priority", "request") or 0) if params else 0,
        timeout_us=(int_parameter(params, "timeout", "request") or 0) if params else 0,
    )
    header_plans.remember(head, header, request, options, limits)
    return request, options


def _decode_input(
    item: Any,
    inputs: dict[str, np.ndarray],
    body: bytes,
    binary: memoryview,
    offset: int,
    budget: RequestBudget,
    shm: SharedMemoryRegistry | None,
) -> int:
    """Decodes one entry of ``inputs`` into ``inputs``; returns the offset of the next binary tensor."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidArgument("each input must be an object with a 'name'")
    name = item["name"]
    if name in inputs:
        raise InvalidArgument(f"input '{name}' appears twice in the request")
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidArgument(f"input '{name}' has no 'datatype'")
    shape = tensors.check_shape(name, item.get("shape"))
    budget.add_input(name, shape)
    iparams = item.get("parameters") or {}
    if not isinstance(iparams, dict):
        raise InvalidArgument(f"input '{name}': 'parameters' must be an object")
    size = iparams.get("binary_data_size")
    if len(iparams) == 1 and type(size) is int and size >= 0:
        ref = None  # {"binary_data_size": n}, what tritonclient sends: nothing else to parse
    else:
        ref = shm_ref(iparams, f"input '{name}'")
        size = int_parameter(iparams, "binary_data_size", f"input '{name}'")
    if ref is not None:
        if "data" in item or size is not None:
            raise InvalidArgument(
                f"input '{name}' has shared-memory parameters and also "
                + ("'data'" if "data" in item else "binary_data_size")
                + "; send its data one way"
            )
        inputs[name] = require(shm).read_input(name, datatype, shape, ref, budget)
    elif size is not None:
        if "data" in item:
            raise InvalidArgument(f"input '{name}' has both 'data' and binary_data_size")
        if offset + size > len(body):
            raise InvalidArgument(
                f"input '{name}' declares binary_data_size {size} but only {len(body) - offset} bytes "
                "of binary data remain in the request body"
            )
        inputs[name] = tensors.from_raw(name, datatype, shape, binary[offset : offset + size], budget)
        offset += size
    elif "data" in item:
        inputs[name] = tensors.from_list(name, datatype, shape, item["data"], budget)
    else:
        raise InvalidArgument(f"input '{name}' has neither 'data' nor binary_data_size")
    return offset


def _decode_output(out: Any, options: dict[str, Any], binary_default: bool, shm: SharedMemoryRegistry | None) -> str:
    """Records one requested output's wire options in ``options``; returns its name."""
    if not isinstance(out, dict) or not isinstance(out.get("name"), str):
        raise InvalidArgument("each requested output must be an object with a 'name'")
    name: str = out["name"]
    oparams = out.get("parameters") or {}
    if not isinstance(oparams, dict):
        raise InvalidArgument(f"output '{name}': 'parameters' must be an object")
    classification = 0
    oref = None
    if len(oparams) > ("binary_data" in oparams):  # more than binary_data: classification, shared memory
        classification, oref = output_options(oparams, name, shm)
    options[name] = {
        "binary": bool(oparams.get("binary_data", binary_default)),
        "classification": classification,
        "shm": oref,
    }
    return name


_ORJSON_NUMPY = {
    np.dtype(t)
    for t in (
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.bool_,
    )
}


#: the options of an output the request did not name (read only)
_AS_BINARY: dict[str, Any] = {"binary": True, "classification": 0, "shm": None}
_AS_JSON: dict[str, Any] = {"binary": False, "classification": 0, "shm": None}


def encode_response(
    response: InferenceResponse, options: dict[str, Any], shm: SharedMemoryRegistry | None = None
) -> tuple[bytes, int | None]:
    """Returns (body, JSON header length when binary parts follow, else None).

    An output requested into shared memory is written there; its entry carries name, datatype and
    shape but no data (Triton's shape for it, which ``tritonclient``'s ``get_output`` reads).
    """
    parts = _binary_parts(response, options)
    if parts is not None:
        head = BINARY_HEADS.get(parts[0])
        if head is not None:
            return b"".join([head, *parts[1]]), len(head)
    default_binary = options.get("__default_binary__", False)
    outputs_json = []
    buffers: list[bytes | memoryview] = []
    for name, array in response.outputs.items():
        opt = options.get(name) or (_AS_BINARY if default_binary else _AS_JSON)
        if opt["classification"]:
            array = classify(array, opt["classification"], response.labels.get(name))
        # orjson writes the shape tuple as a list: no copy
        entry: dict[str, Any] = {"name": name, "datatype": tensors.v2_datatype(array), "shape": array.shape}
        if opt.get("shm") is not None:
            require(shm).write_output(name, array, opt["shm"])
        elif opt["binary"]:
            raw = tensors.to_raw(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            buffers.append(raw)
        elif array.dtype in _ORJSON_NUMPY:
            entry["data"] = np.ascontiguousarray(array).ravel()
        else:
            entry["data"] = tensors.to_list(array)
        outputs_json.append(entry)
    header: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        header["id"] = response.id
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = outputs_json
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    if not buffers:
        return head, None
    if parts is not None:
        BINARY_HEADS.keep(parts[0], head)
    return b"".join([head, *buffers]), len(head)


#: JSON headers of all-binary responses already written, by ``_binary_parts``' key (oldest dropped first)
BINARY_HEADS: header_plans.Kept[tuple[Any, ...], bytes] = header_plans.Kept(256)


def _binary_parts(
    response: InferenceResponse, options: dict[str, Any]
) -> tuple[tuple[Any, ...], list[bytes | memoryview]] | None:
    """The key of the response's JSON header and its binary parts, when the header is decided by the
    model, version and each output's name, dtype and shape alone: every output goes back as plain binary
    (no classification, no shared memory, no BYTES) and there is no id or response parameter.

    A client calling in a loop gets the same header every time: it is taken from ``BINARY_HEADS`` rather
    than encoded again (README 'Performance against Triton and MLServer').
    """
    if response.id or response.parameters:
        return None
    default_binary = options.get("__default_binary__", False)
    key: list[Any] = [response.model_name, response.model_version]
    buffers = []
    for name, array in response.outputs.items():
        opt = options.get(name)
        if opt is None:
            if not default_binary:
                return None
        elif not opt["binary"] or opt["classification"] or opt.get("shm") is not None:
            return None
        if array.dtype.kind == "O":
            return None
        key += (name, array.dtype, array.shape)
        buffers.append(tensors.to_raw(array))
    return tuple(key), buffers
