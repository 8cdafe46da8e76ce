"""OpenAI's API over the runtime: what Triton's ``python/openai`` frontend serves, for models in a repository.

Triton's frontend (server repo, ``python/openai/openai_frontend``: ``engine/triton_engine.py``,
``engine/utils/triton.py``, ``frontend/fastapi/routers/*.py``) is followed where it does not need a tokenizer:

* ``GET /v1/models`` (and ``/v1/models/{id}``): every ready model, ``{"id", "object": "model", "created",
  "owned_by"}``; ``created`` is when the frontend started (Triton: when its engine started).
* ``POST /v1/completions`` and ``/v1/chat/completions``: the model needs a BYTES input ``text_input`` and a
  BYTES output ``text_output`` (the generate-extension conventions). The request becomes Triton's TRT-LLM
  style request (``_create_trtllm_generate_request``, its default for every backend but vLLM): the prompt as
  ``text_input``; ``max_tokens`` (``max_completion_tokens`` first for chat; default 16, Triton's
  ``--default-max-tokens``), ``temperature``, ``top_p``, ``frequency_penalty``, ``presence_penalty``, ``seed``,
  ``stop`` (as ``stop_words``) and ``stream`` as the inputs of those names where the model has them, else as
  request parameters (a ``stop`` list as its JSON text); ``echo`` as ``exclude_input_in_output`` where the
  model has that input. ``n`` > 1, ``logprobs``, ``logit_bias`` and tools are refused (400), as Triton does
  without vLLM or a tool-call parser.
* chat has no tokenizer here, so no tokenizer chat template: the messages are rendered with the documented
  template ``CHAT_TEMPLATE`` (``"<role>: <content>\\n"`` per message, then ``"assistant:"``).
* responses: every ``text_output`` the model sends, in order. Without ``stream`` they are joined into one
  choice (Triton wants exactly one response there); with ``stream`` each is one chunk
  (``chat.completion.chunk``: first a ``role`` delta, as Triton; ``text_completion``), then a chunk with
  ``finish_reason``, a usage chunk when ``stream_options.include_usage``, and ``data: [DONE]``.
* ``usage``: ``num_input_tokens``/``num_output_tokens`` outputs where the model has them (Triton reads
  them from vLLM models), else whitespace-separated words of the prompt and one token per response.
* ``POST /v1/embeddings``: a model with one BYTES input (``text_input`` preferred) and a floating-point
  output (``embedding`` preferred); one request per input string; ``encoding_format`` ``float`` or
  ``base64`` (little-endian FP32, as Triton's ``_get_embedding``).
* errors: OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with the runtime's HTTP status
  (unknown model: 404, ``model_not_found``; bad request or a model that does not follow the conventions:
  400). Triton answers FastAPI's ``{"detail": ...}`` with 400 for most of these.

``--auth-token-file`` applies here too: OpenAI clients send ``Authorization: Bearer <api_key>``.

Traces (``--trace-config``): completions and chat completions are traced as streamed requests (``Tracer.stream``),
ending once the last response was sent or the client went away; embeddings as unary requests. In the OpenTelemetry
mode a ``traceparent`` header makes the request's spans children of the caller's.
"""

from __future__ import annotations

import base64
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from .. import SERVER_NAME
from ..observability import otel
from ..observability.trace import StreamTrace
from ..runtime.auth import BearerToken
from ..runtime.service import InferenceService
from ..vocabulary import tensors
from ..vocabulary.errors import NotFound, ServerError
from ..vocabulary.streaming import ResponseStream, StreamItem
from ..vocabulary.types import InferenceRequest, InferenceResponse

#: Triton's ``--default-max-tokens``
DEFAULT_MAX_TOKENS = 16
#: per message; then GENERATION_PROMPT (no tokenizer, so no tokenizer chat template: README)
CHAT_TEMPLATE = "{role}: {content}\n"
GENERATION_PROMPT = "assistant:"
SSE = "text/event-stream; charset=utf-8"
#: OpenAI field → the model input it becomes where the model has one (Triton's TRT-LLM request)
INPUT_NAMES = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "stop": "stop_words",
    "stream": "stream",
}
#: fields accepted and not passed to the model
IGNORED = {"user", "metadata", "store", "service_tier", "suffix", "parallel_tool_calls", "response_format"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def _error_response(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    kind = (
        "invalid_request_error"
        if status < 500 and status != 401
        else "authentication_error"
        if status == 401
        else "server_error"
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _from_server_error(exc: ServerError) -> OpenAIError:
    code = "model_not_found" if isinstance(exc, NotFound) else None
    return OpenAIError(exc.http_status, str(exc), code)


# ---- request fields -----------------------------------------------------------------------------
def _bad(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, None, param)


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"'{key}' must be a number", key)
    if not low <= value <= high:
        raise _bad(f"'{key}' must be between {low:g} and {high:g}, got {value}", key)
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{key}' must be an integer", key)
    if value < low:
        raise _bad(f"'{key}' must be at least {low}, got {value}", key)
    return value


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model")
    return body


def _stop(body: dict[str, Any]) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise _bad("'stop' must be a string or a list of strings", "stop")


def _common(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The sampling fields of a (chat) completion request, checked; unsupported ones refused as Triton does."""
    n = _integer(body, "n", 1)
    if n is not None and n > 1:
        raise _bad(f"Received n={n}, but only single choice (n=1) is currently supported", "n")
    if body.get("logit_bias") is not None:
        raise _bad("logit bias is not currently supported", "logit_bias")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise _bad("logprobs are not supported by this server", "logprobs")
    if chat and (body.get("tools") or body.get("tool_choice") or body.get("functions")):
        raise _bad("tools and function calls are not supported by this server (no tool-call parser)", "tools")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise _bad("`stream_options` can only be used when `stream` is True", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    max_tokens = _integer(body, "max_completion_tokens", 0) if chat else None
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 0)
    fields: dict[str, Any] = {
        "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "temperature": _number(body, "temperature", 0.0, 2.0),
        "top_p": _number(body, "top_p", 0.0, 1.0),
        "frequency_penalty": _number(body, "frequency_penalty", -2.0, 2.0),
        "presence_penalty": _number(body, "presence_penalty", -2.0, 2.0),
        "seed": _integer(body, "seed", -(2**63)),
        "stop": _stop(body),
        "stream": stream,
    }
    return {k: v for k, v in fields.items() if v is not None}


def render_chat(messages: Any) -> str:
    """The prompt of a chat request: ``CHAT_TEMPLATE`` per message, then ``GENERATION_PROMPT``."""
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string 'role'", "messages")
        content = message.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _bad(f"messages[{i}]: only text content parts are supported", "messages")
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
        parts.append(CHAT_TEMPLATE.format(role=message["role"], content=content))
    return "".join(parts) + GENERATION_PROMPT


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("'prompt' must be a string (token arrays and several prompts are not supported)", "prompt")
    return prompt


# ---- model conventions --------------------------------------------------------------------------
@dataclass
class _Model:
    name: str
    inputs: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    required: set[str] = field(default_factory=set)


def _model(service: InferenceService, name: str) -> _Model:
    try:
        metadata = service.model_metadata(name)
        config = service.model_config(name)
    except NotFound:
        raise OpenAIError(404, f"The model '{name}' does not exist", "model_not_found", "model") from None
    except ServerError as exc:
        raise _from_server_error(exc) from None
    required = {i.name for i in config.input if not i.optional}
    return _Model(
        name,
        {i["name"]: i for i in metadata["inputs"]},
        {o["name"]: o for o in metadata["outputs"]},
        required,
    )


def _check_generate(model: _Model) -> None:
    if model.inputs.get("text_input", {}).get("datatype") != "BYTES" or (
        model.outputs.get("text_output", {}).get("datatype") != "BYTES"
    ):
        raise _bad(
            f"model '{model.name}' does not follow the generate conventions the completions endpoints need: "
            "a BYTES input 'text_input' and a BYTES output 'text_output'",
            "model",
        )


def _tensor(name: str, meta: dict[str, Any], value: Any) -> np.ndarray:
    shape = [1 if d == -1 else d for d in meta["shape"]]
    values = value if isinstance(value, list) else [value]
    if len(values) == 1 and math.prod(shape) != 1:
        raise _bad(f"the model's input '{name}' has shape {meta['shape']}: it cannot take one value")
    if len(values) != 1:  # stop_words: a list along the innermost variable dim
        shape = [1] * (len(shape) - 1) + [len(values)] if shape else [len(values)]
    return tensors.from_list(name, meta["datatype"], shape, values)


def _generate_request(model: _Model, prompt: str, fields: dict[str, Any], echo: bool) -> InferenceRequest:
    inputs = {"text_input": _tensor("text_input", model.inputs["text_input"], prompt)}
    parameters: dict[str, Any] = {}
    for key, value in fields.items():
        input_name = INPUT_NAMES[key]
        if input_name in model.inputs:
            inputs[input_name] = _tensor(input_name, model.inputs[input_name], value)
        elif key != "stream":
            parameters[key] = orjson.dumps(value).decode() if isinstance(value, list) else value
    if "exclude_input_in_output" in model.inputs:
        inputs["exclude_input_in_output"] = _tensor(
            "exclude_input_in_output", model.inputs["exclude_input_in_output"], not echo
        )
    missing = sorted(model.required - inputs.keys())
    if missing:
        raise _bad(
            f"model '{model.name}' needs input(s) {', '.join(missing)} that an OpenAI request does not give: "
            "the completions endpoints fill only text_input and the sampling inputs (max_tokens, temperature, "
            "top_p, frequency_penalty, presence_penalty, seed, stop_words, stream, exclude_input_in_output)",
            "model",
        )
    return InferenceRequest(model_name=model.name, inputs=inputs, parameters=parameters)


def _text(item: StreamItem) -> str:
    assert item.response is not None
    array = item.response.outputs.get("text_output")
    if array is None:
        return ""
    return "".join(tensors.to_list(array))


def _count(item: StreamItem, name: str) -> int | None:
    assert item.response is not None
    array = item.response.outputs.get(name)
    return int(array.ravel()[0]) if array is not None and array.size == 1 else None


@dataclass
class _Usage:
    prompt_words: int
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    counted_by_model: bool = False

    def add(self, item: StreamItem) -> None:
        given_in, given_out = _count(item, "num_input_tokens"), _count(item, "num_output_tokens")
        if given_in is not None and given_out is not None:
            if not self.counted_by_model:
                self.counted_by_model, self.completion_tokens = True, 0
            self.prompt_tokens = given_in
            self.completion_tokens += given_out
        elif not self.counted_by_model:
            self.completion_tokens += 1

    def as_dict(self) -> dict[str, int]:
        prompt = self.prompt_words if self.prompt_tokens is None else self.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }


def _finish(usage: _Usage, fields: dict[str, Any]) -> str:
    return "length" if usage.completion_tokens >= fields["max_tokens"] > 0 else "stop"


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


# ---- the app ------------------------------------------------------------------------------------
def build_openai_app(service: InferenceService, token: BearerToken | None = None) -> Any:
    """The ASGI app of the OpenAI listener: the token check (``/v1/...`` only), then the FastAPI routes."""
    app = _routes(service)
    return app if token is None else _Authenticated(app, token)


class _Authenticated:
    """``Authorization: Bearer <--auth-token-file's token>`` on ``/v1/...`` (plain ASGI: streams stay direct)."""

    def __init__(self, app: FastAPI, token: BearerToken) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            headers = dict(scope["headers"])
            if not self.token.accepts(headers.get(b"authorization")):
                await _error_response(401, "Incorrect API key provided", "invalid_api_key")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _routes(service: InferenceService) -> FastAPI:
    app = FastAPI(title="kubeinfer OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> Response:
        return _error_response(exc.status, exc.message, exc.code, exc.param)

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> Response:
        e = _from_server_error(exc)
        return _error_response(e.status, e.message, e.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _error_response(exc.status_code, str(exc.detail))

    @app.get("/health/ready")
    async def health_ready() -> Response:
        return Response(status_code=200 if service.ready() else 503)

    def model_object(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": SERVER_NAME}

    def ready_names() -> list[str]:
        return sorted({row["name"] for row in service.repository_index(ready_only=True)})

    @app.get("/v1/models")
    async def list_models() -> Response:
        return JSONResponse({"object": "list", "data": [model_object(n) for n in ready_names()]})

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> Response:
        if model_id not in ready_names():
            raise OpenAIError(404, f"The model '{model_id}' does not exist", "model_not_found", "model")
        return JSONResponse(model_object(model_id))

    async def generate(request: Request, chat: bool) -> Response:
        body = _parse_body(await request.body())
        fields = _common(body, chat)
        prompt = render_chat(body.get("messages")) if chat else _prompt(body)
        echo = bool(body.get("echo")) if not chat else False
        await service.ensure_loaded(body["model"])
        model = _model(service, body["model"])
        _check_generate(model)
        if otel.propagation:  # the caller's W3C trace context, for --trace-config mode=opentelemetry
            otel.from_headers(request.scope["headers"])
        stream, trace = service.tracer.stream(_generate_request(model, prompt, fields, echo), service.infer_stream)
        try:
            first = await _next_answer(stream)
        except BaseException:
            _end(trace, None)
            raise
        if first is not None and first.error is not None:
            stream.cancel()
            _end(trace, None)
            raise _from_server_error(first.error)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        usage = _Usage(prompt_words=len(prompt.split()))
        head = {"id": request_id, "created": int(time.time()), "model": body["model"]}
        if fields["stream"]:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = _chat_events if chat else _completion_events
            return StreamingResponse(
                events(head, first, stream, usage, fields, include_usage, prompt if echo else "", trace),
                media_type=SSE,
            )
        pieces = [prompt] if echo else []
        item, last = first, None
        try:
            while item is not None:
                if item.error is not None:
                    raise _from_server_error(item.error)
                usage.add(item)
                pieces.append(_text(item))
                last = item.response or last
                item = await _next_answer(stream)
        finally:
            if not stream.finished:  # an error response, or the client went away: nobody reads further
                stream.cancel()
            _end(trace, last)
        text = "".join(pieces)
        finish = _finish(usage, fields)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage.as_dict()})
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return JSONResponse({**head, "object": "text_completion", "choices": [choice], "usage": usage.as_dict()})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = _parse_body(await request.body())
        if otel.propagation:
            otel.from_headers(request.scope["headers"])
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise _bad("'input' must be a string or a non-empty list of strings (token arrays are not supported)")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise _bad("'encoding_format' must be 'float' or 'base64'", "encoding_format")
        await service.ensure_loaded(body["model"])
        model = _model(service, body["model"])
        text_input, output = _embedding_tensors(model)
        _integer(body, "dimensions", 1)
        if model.required - {text_input}:
            raise _bad(f"model '{model.name}' needs inputs besides '{text_input}': not an embedding model", "model")
        data = []
        for index, text in enumerate(texts):
            inputs = {text_input: _tensor(text_input, model.inputs[text_input], text)}
            result = await service.infer(
                InferenceRequest(model_name=model.name, inputs=inputs, requested_outputs=[output])
            )
            vector = np.asarray(result.outputs[output], dtype=np.float32).ravel()
            if body.get("dimensions") is not None and body["dimensions"] != vector.size:
                raise _bad(f"model '{model.name}' returns {vector.size} dimensions, not {body['dimensions']}")
            embedding: Any = (
                vector.tolist() if encoding == "float" else base64.b64encode(vector.astype("<f4").tobytes()).decode()
            )
            data.append({"object": "embedding", "embedding": embedding, "index": index})
        words = sum(len(t.split()) for t in texts)
        usage = {"prompt_tokens": words, "total_tokens": words}
        return JSONResponse({"object": "list", "data": data, "model": body["model"], "usage": usage})

    return app


def _embedding_tensors(model: _Model) -> tuple[str, str]:
    texts = [n for n, m in model.inputs.items() if m["datatype"] == "BYTES"]
    floats = [n for n, m in model.outputs.items() if m["datatype"] in ("FP32", "FP16", "BF16", "FP64")]
    text_input = "text_input" if "text_input" in texts else texts[0] if len(texts) == 1 else None
    output = "embedding" if "embedding" in floats else floats[0] if len(floats) == 1 else None
    if text_input is None or output is None:
        raise _bad(
            f"model '{model.name}' is not an embedding model: /v1/embeddings needs one BYTES input ('text_input' "
            "where there are several) and one floating-point output ('embedding' where there are several)",
            "model",
        )
    return text_input, output


def _end(trace: StreamTrace | None, last: InferenceResponse | None) -> None:
    """End a traced request's trace with its last response (None: it sent none)."""
    if trace is not None:
        trace.end(last)


async def _next_answer(stream: ResponseStream) -> StreamItem | None:
    """The next response or error of ``stream`` (a flag-only final is skipped); None at its end."""
    async for item in stream:
        if item.response is not None or item.error is not None:
            return item
    return None


async def _chat_events(
    head: dict[str, Any],
    first: StreamItem | None,
    stream: ResponseStream,
    usage: _Usage,
    fields: dict[str, Any],
    include_usage: bool,
    echoed: str,
    trace: StreamTrace | None,
) -> AsyncIterator[bytes]:
    chunk = {**head, "object": "chat.completion.chunk"}

    def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**chunk, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]})

    async for event in _events(first, stream, usage, fields, include_usage, chunk, echoed, delta, trace):
        yield event


async def _completion_events(
    head: dict[str, Any],
    first: StreamItem | None,
    stream: ResponseStream,
    usage: _Usage,
    fields: dict[str, Any],
    include_usage: bool,
    echoed: str,
    trace: StreamTrace | None,
) -> AsyncIterator[bytes]:
    chunk = {**head, "object": "text_completion"}

    def piece(d: dict[str, Any], finish: str | None = None) -> bytes:
        text = d.get("content", "")
        return _sse({**chunk, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]})

    async for event in _events(first, stream, usage, fields, include_usage, chunk, echoed, piece, trace):
        yield event


async def _events(
    first: StreamItem | None,
    stream: ResponseStream,
    usage: _Usage,
    fields: dict[str, Any],
    include_usage: bool,
    chunk: dict[str, Any],
    echoed: str,
    encode: Any,
    trace: StreamTrace | None,
) -> AsyncIterator[bytes]:
    chat = chunk["object"] == "chat.completion.chunk"
    last: InferenceResponse | None = None  # the trace's model version; the responses are not kept
    try:
        if chat:
            yield encode({"role": "assistant", "content": ""})
        if echoed:
            yield encode({"content": echoed})
        item = first
        while item is not None:
            if item.error is not None:
                e = _from_server_error(item.error)
                kind = "server_error" if e.status >= 500 else "invalid_request_error"
                yield _sse({"error": {"message": e.message, "type": kind, "param": None, "code": e.code}})
                return
            usage.add(item)
            last = item.response or last
            yield encode({"content": _text(item)})
            item = await _next_answer(stream)
        yield encode({} if chat else {"content": ""}, _finish(usage, fields))
        if include_usage:
            yield _sse({**chunk, "choices": [], "usage": usage.as_dict()})
        yield b"data: [DONE]\n\n"
    finally:
        if not stream.finished:  # the client closed the connection (or the model failed): cancel the request
            stream.cancel()
        _end(trace, last)


__all__ = ["CHAT_TEMPLATE", "DEFAULT_MAX_TOKENS", "GENERATION_PROMPT", "build_openai_app", "render_chat"]
