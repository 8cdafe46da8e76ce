"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` and ``/generate_stream``.

What LLM clients speak to Triton (docs/protocol/extension_generate.md; server/src/http_server.cc
``HandleGenerate``, ``GenerateRequestClass``; checked against Triton 2.51):

* the request is one flat JSON object: a key naming a model input is that input (a scalar or a flat
  list, shaped to the input's dims: fixed dims take what they need, the innermost variable dim the rest,
  other variable dims 1); any other key is a request parameter (string, integer, boolean or number);
* every response is one flat JSON object: each output by name (a one-element output as a bare value),
  ``model_name``, ``model_version``, ``id`` when the request had one, and the response's parameters;
* ``generate`` needs exactly one response (else Triton's "generate expects model to produce exactly 1
  response..." error in the body); ``generate_stream`` sends each response as a server-sent event
  ``data: {...}`` as the model sends it, and nothing for a flag-only final;
* an error a model answers with is ``{"error": "..."}`` (an event in a stream); the HTTP status is the
  first response's: 200, or 400 when it is an error (Triton 2.51 answers 400 whatever the error's code).
  Errors before the model runs (unknown model, bad input) use the normal status table.

Closing the connection of a ``generate_stream`` cancels the request (``is_cancelled()`` in the model).
The request is sampled for tracing as an ``infer`` one, its trace ending after its last response (with
``--trace-config mode=opentelemetry`` under its ``traceparent`` header; ``observability.trace``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response, StreamingResponse

from ..observability import otel
from ..observability.trace import StreamTrace
from ..runtime.service import InferenceService
from ..vocabulary import tensors
from ..vocabulary.errors import InvalidArgument
from ..vocabulary.streaming import ResponseStream, StreamItem
from ..vocabulary.types import InferenceRequest, InferenceResponse
from . import json_body
from .codec import error_body

SSE = "text/event-stream; charset=utf-8"
ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)
#: a model's error inside a generate response: Triton 2.51 answers 400 for every error code here
RESPONSE_ERROR_STATUS = 400


async def generate(service: InferenceService, name: str, version: str, request: Request, streaming: bool) -> Response:
    body = await request.body()
    await service.ensure_loaded(name, version)
    if otel.propagation:  # the caller's W3C trace context, for --trace-config mode=opentelemetry
        otel.from_headers(request.scope["headers"])
    stream, trace = service.tracer.stream(to_request(service, name, version, body), service.infer_stream)
    try:
        first = await anext(stream, None)
    except BaseException:
        if trace is not None:
            trace.end(None)
        raise
    status = RESPONSE_ERROR_STATUS if first is not None and first.error is not None else 200
    if streaming:
        return StreamingResponse(_events(first, stream, trace), status_code=status, media_type=SSE)
    answers = [] if first is None else [first]
    try:
        async for item in stream:
            answers.append(item)
    finally:
        if trace is not None:
            trace.end(_last_response(answers))
    answers = [a for a in answers if a.response is not None or a.error is not None]
    payload = error_body(ONE_RESPONSE) if len(answers) != 1 else _payload(answers[0])
    return Response(payload, status_code=status, media_type="application/json")


async def _events(first: StreamItem | None, stream: ResponseStream, trace: StreamTrace | None) -> AsyncIterator[bytes]:
    last = None if first is None else first.response  # the trace's model version; the events are not kept
    try:
        if first is not None and (first.response is not None or first.error is not None):
            yield b"data: " + _payload(first) + b"\n\n"
        async for item in stream:
            last = item.response or last
            if item.response is not None or item.error is not None:
                yield b"data: " + _payload(item) + b"\n\n"
    finally:
        if not stream.finished:  # the client closed the connection
            stream.cancel()
        if trace is not None:
            trace.end(last)


def _last_response(items: list[StreamItem]) -> InferenceResponse | None:
    return next((i.response for i in reversed(items) if i.response is not None), None)


def _payload(item: StreamItem) -> bytes:
    if item.error is not None:
        return error_body(item.error.message)
    assert item.response is not None
    return orjson.dumps(_flat(item.response), option=orjson.OPT_SORT_KEYS)


def _flat(response: InferenceResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        out["id"] = response.id
    out.update(response.parameters)
    for name, array in response.outputs.items():
        values = tensors.to_list(array)
        out[name] = values[0] if len(values) == 1 else values
    return out


def to_request(service: InferenceService, name: str, version: str, body: bytes) -> InferenceRequest:
    data = json_body.parse_object(body, "the generate request")
    metadata = service.model_metadata(name, version)
    inputs = {i["name"]: i for i in metadata["inputs"]}
    request_id = data.pop("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument("Unable to parse 'id'")
    arrays = {}
    parameters: dict[str, Any] = {}
    for key, value in data.items():
        meta = inputs.get(key)
        if meta is None:
            if isinstance(value, (str, int, float, bool)):
                parameters[key] = value
                continue
            raise InvalidArgument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
        values = value if isinstance(value, list) else [value]
        arrays[key] = tensors.from_list(key, meta["datatype"], _shape(key, len(values), meta["shape"]), values)
    return InferenceRequest(model_name=name, model_version=version, inputs=arrays, id=request_id, parameters=parameters)


def _shape(name: str, count: int, dims: list[int]) -> list[int]:
    """Triton's two passes: fixed dims take their share from the innermost out, the innermost -1 the rest."""
    shape = list(dims)
    refused = InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")
    for d in reversed(shape):
        if d != -1:
            if d == 0 or count % d:
                raise refused
            count //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = count
            count = 1
    if count != 1:
        raise refused
    return shape
