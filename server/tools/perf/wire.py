"""Requests encoded once, before the load starts: raw HTTP/1.1 bytes or a serialized ModelInferRequest.

The load generator shares the machine's cores with the server, so a request costs it one socket write
(HTTP) or one call with pre-serialized bytes (gRPC); nothing is encoded per request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ...grpc import grpc_service_pb2 as pb
from ...vocabulary import tensors


def _v2_datatype(array: np.ndarray, declared: str) -> str:
    return declared if declared in ("BYTES", "BF16") else tensors.v2_datatype(array)


def http_request(
    host: str,
    model: str,
    version: str,
    step: dict[str, np.ndarray],
    datatypes: dict[str, str],
    outputs: tuple[str, ...],
    binary_inputs: bool,
    binary_outputs: bool,
    headers: list[tuple[str, str]],
) -> bytes:
    """One complete ``POST .../infer`` (request line, headers, body) for a keep-alive connection."""
    inputs: list[dict[str, Any]] = []
    payloads: list[bytes] = []
    for name, array in step.items():
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(array.shape),
            "datatype": _v2_datatype(array, datatypes[name]),
        }
        if binary_inputs:
            raw = bytes(tensors.to_raw(array))
            entry["parameters"] = {"binary_data_size": len(raw)}
            payloads.append(raw)
        elif array.dtype == np.object_:
            entry["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.ravel()]
        else:
            entry["data"] = array.ravel().tolist()
        inputs.append(entry)
    header: dict[str, Any] = {"inputs": inputs}
    if outputs:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": binary_outputs}} for n in outputs]
    elif binary_outputs:
        header["parameters"] = {"binary_data_output": True}
    head = orjson.dumps(header)
    body = head + b"".join(payloads)
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    if payloads:
        lines += ["Content-Type: application/octet-stream", f"Inference-Header-Content-Length: {len(head)}"]
    else:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def grpc_request(
    model: str,
    version: str,
    step: dict[str, np.ndarray],
    datatypes: dict[str, str],
    outputs: tuple[str, ...],
    raw_inputs: bool,
) -> bytes:
    """A serialized ModelInferRequest: ``raw_input_contents`` (binary) or typed ``contents``."""
    message = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, array in step.items():
        datatype = _v2_datatype(array, datatypes[name])
        item = message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw_inputs:
            message.raw_input_contents.append(bytes(tensors.to_raw(array)))
        else:
            field = tensors.CONTENTS_FIELD.get(datatype)
            if field is None:
                raise ValueError(f"input '{name}': {datatype} has no typed contents field; use binary inputs")
            values = list(array.ravel()) if array.dtype == np.object_ else array.ravel().tolist()
            getattr(item.contents, field).extend(values)
    for name in outputs:
        message.outputs.add(name=name)
    return message.SerializeToString()
