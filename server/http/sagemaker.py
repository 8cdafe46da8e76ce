"""The SageMaker listener (``--allow-sagemaker=true``, port ``--sagemaker-port``, 8080), as Triton's
``src/sagemaker_server.cc``.

- ``GET /ping``: the server's readiness (``SAGEMAKER_TRITON_PING_MODE=live``: liveness), as ``/v2/health/ready``.
- ``POST /invocations``: a KServe v2 inference request for the model ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``
  names (Triton's placeholder ``unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` when unset). Binary tensors
  are announced by ``Content-Type: application/vnd.sagemaker-triton.binary+json;json-header-size=<N>`` (N=0:
  the body is the model's one input, raw) and answered with that type when binary outputs follow.
  ``SAGEMAKER_TRITON_INFERENCE_TYPE=generate|generate_stream`` serves the generate extension there instead.
- Multi-model routes (``/models``...): Triton lists only models loaded through ``POST /models`` with a
  ``url``, which registers that folder as another model repository. Loading from a url is refused here
  (400 with the reason), so the list is empty and the routes that name a model answer 404, as Triton's do
  for a model it did not load that way.
- Anything else: 400 with an empty body, as Triton.
"""

from __future__ import annotations

import logging
import os
import re

from .cloud_frontend import authorized, infer, json_headers, respond, rewritten
from .codec import error_body
from .infer_route import InferRoute, Receive, Scope, Send

log = logging.getLogger(__name__)

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
DEFAULT_MODEL_ENV = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
UNSPECIFIED_MODEL = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
#: Triton's models_regex_
MODELS_PATH = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
#: Triton's SageMakerMMECheckOOMError: an error with one of these words answers 507
OOM_WORDS = (
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "OOM",
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
)
MME_LOAD_REFUSED = (
    "SageMaker multi-model loading (POST /models with a 'url') is not supported by this server: "
    "serve the models from --model-repository and call /invocations"
)


def inference_type(environ: dict[str, str] | None = None) -> str:
    """``SAGEMAKER_TRITON_INFERENCE_TYPE`` (default ``infer``); ValueError, in Triton's words, for others."""
    value = (os.environ if environ is None else environ).get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")
    if value not in INFERENCE_TYPES:
        raise ValueError(
            f"Server has invalid inference type '{value}'. Must be one of: infer, generate, generate_stream."
        )
    return value


class SageMakerApp:
    """ASGI app of the SageMaker listener over the HTTP front end ``route``."""

    def __init__(self, route: InferRoute, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.route = route
        self.model = env.get(DEFAULT_MODEL_ENV, UNSPECIFIED_MODEL)
        self.ping = (
            "/v2/health/live" if env.get("SAGEMAKER_TRITON_PING_MODE", "ready") == "live" else "/v2/health/ready"
        )
        self.inference_type = inference_type(dict(env))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/ping":
            await self.route(rewritten(scope, self.ping), receive, send)  # GET only: 405 otherwise, as Triton
            return
        if path == "/invocations":
            if self.inference_type != "infer":
                await self.route(rewritten(scope, f"/v2/models/{self.model}/{self.inference_type}"), receive, send)
                return
            if method != "POST":
                await respond(send, 405)
                return
            if await authorized(self.route, scope, send):
                await self._invoke(scope, receive, send)
            return
        match = MODELS_PATH.fullmatch(path)
        if match is not None:
            name, action = match.group(1), match.group(2)
            if method == "GET" and not name:
                await respond(send, 200, b'{"models":[]}', json_headers())
            elif method == "GET" or method == "DELETE" or (method == "POST" and action):
                await respond(send, 404)  # not loaded through POST /models
            elif method == "POST":
                log.error("SageMaker load of %s refused: %s", name or "a model", MME_LOAD_REFUSED)
                await respond(send, 400, error_body(MME_LOAD_REFUSED), json_headers())
            else:
                await respond(send, 400)
            return
        await respond(send, 400)

    async def _invoke(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = await infer(self.route, scope, receive, self.model, "", BINARY_MIME)
        if answer is None:
            return
        status, payload, json_length = answer
        if status != 200 and any(word in payload.decode("utf-8", "replace") for word in OOM_WORDS):
            status = 507
        if json_length is None:
            await respond(send, status, payload, json_headers())
        else:
            await respond(send, status, payload, [(b"content-type", f"{BINARY_MIME}{json_length}".encode())])


def build_sagemaker_app(route: InferRoute) -> SageMakerApp:
    return SageMakerApp(route)
