"""Routes of the KServe v2 REST API plus Triton's extensions (statistics, repository, config).

Handlers translate HTTP to the runtime's InferenceService and back; they never touch a backend.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
from collections.abc import Mapping
from importlib import resources
from typing import Any

import orjson
import yaml
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..runtime.auth import BearerToken
from ..runtime.service import InferenceService
from ..sharedmemory import SharedMemoryRegistry
from ..sharedmemory.registry import DISABLED as SHM_DISABLED
from ..vocabulary.errors import InvalidArgument, ServerError, Unsupported, internal_error_message
from ..vocabulary.limits import DEFAULT_LIMITS, Limits
from . import json_body
from .codec import error_body
from .generate import generate
from .infer_route import InferRoute

log = logging.getLogger(__name__)

JSON = "application/json"
#: model names one repository poll request may name
MAX_POLLED = 10_000
NOT_READY = "Model version not ready"


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def _error(message: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON, headers=headers)


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The hand-written OpenAPI description of this API (``openapi.yaml``; a test keeps it in step with the routes)."""
    return dict(yaml.safe_load(resources.files(__package__).joinpath("openapi.yaml").read_text(encoding="utf-8")))


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"'{key}' must be true or false, got {value!r}")
    return value


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):  # false, 0, [] and null too: not an object
        raise InvalidArgument("'parameters' must be a JSON object")
    return params


async def _json_body(request: Request) -> dict[str, Any]:
    return json_body.parse_object(await request.body())


def _numeric(version: str) -> None:
    """Triton's routes take numeric versions only; anything else is an unknown route (404 "Not Found")."""
    if not version.isdigit():
        raise StarletteHTTPException(404, "Not Found")


def build_http_app(
    service: InferenceService,
    limits: Limits = DEFAULT_LIMITS,
    token: BearerToken | None = None,
    shm: SharedMemoryRegistry | None = None,
) -> InferRoute:
    """The whole HTTP front end: the token check and the inference route, then FastAPI for everything else."""
    return InferRoute(build_app(service, shm), service, limits, token, shm)


def _uint(body: dict[str, Any], key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"Unable to parse '{key}': expected a non-negative integer, got {value!r}")
    return value


def _add_shared_memory_routes(app: FastAPI, shm: SharedMemoryRegistry | None) -> None:
    """Triton's shared-memory extension routes (docs/protocol/extension_shared_memory.md)."""

    def registry() -> SharedMemoryRegistry:
        if shm is None:
            raise Unsupported(SHM_DISABLED)
        return shm

    @app.get("/v2/systemsharedmemory/status")
    async def system_status_all() -> Response:
        return _json(registry().system_status())

    @app.get("/v2/systemsharedmemory/region/{region_name}/status")
    async def system_status(region_name: str) -> Response:
        return _json(registry().system_status(region_name))

    @app.post("/v2/systemsharedmemory/region/{region_name}/register")
    async def system_register(region_name: str, request: Request) -> Response:
        body = await _json_body(request)
        key = body.get("key")
        if not isinstance(key, str):
            raise InvalidArgument("Unable to parse 'key': expected a string")
        registry().register_system(region_name, key, _uint(body, "offset", 0), _uint(body, "byte_size"))
        return Response(status_code=200)

    @app.post("/v2/systemsharedmemory/region/{region_name}/unregister")
    async def system_unregister(region_name: str) -> Response:
        registry().unregister_system(region_name)
        return Response(status_code=200)

    @app.post("/v2/systemsharedmemory/unregister")
    async def system_unregister_all() -> Response:
        registry().unregister_system()
        return Response(status_code=200)

    @app.get("/v2/cudasharedmemory/status")
    async def cuda_status_all() -> Response:
        return _json(registry().cuda_status())

    @app.get("/v2/cudasharedmemory/region/{region_name}/status")
    async def cuda_status(region_name: str) -> Response:
        return _json(registry().cuda_status(region_name))

    @app.post("/v2/cudasharedmemory/region/{region_name}/register")
    async def cuda_register(region_name: str, request: Request) -> Response:
        body = await _json_body(request)
        raw = body.get("raw_handle")
        b64 = raw.get("b64") if isinstance(raw, dict) else None
        if not isinstance(b64, str):
            raise InvalidArgument("Unable to parse 'raw_handle': expected {\"b64\": <base64 string>}")
        try:
            handle = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("Unable to parse 'raw_handle': invalid base64") from None
        registry().register_cuda(region_name, handle, _uint(body, "device_id", 0), _uint(body, "byte_size"))
        return Response(status_code=200)

    @app.post("/v2/cudasharedmemory/region/{region_name}/unregister")
    async def cuda_unregister(region_name: str) -> Response:
        registry().unregister_cuda(region_name)
        return Response(status_code=200)

    @app.post("/v2/cudasharedmemory/unregister")
    async def cuda_unregister_all() -> Response:
        registry().unregister_cuda()
        return Response(status_code=200)


def build_app(service: InferenceService, shm: SharedMemoryRegistry | None = None) -> FastAPI:
    app = FastAPI(title="kubeinfer", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ServerError)
    async def server_error(_: Request, exc: ServerError) -> Response:
        return _error(exc.message, exc.http_status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        # unknown routes and methods answer in the v2 error shape too
        return _error(str(exc.detail), exc.status_code, exc.headers)  # e.g. 405 keeps its Allow header

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        return _error(str(exc), 400)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unexpected error")
        return _error(internal_error_message(exc), 500)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return _json(openapi_document())

    # ---- health and server metadata ---------------------------------------------------------
    @app.get("/v2")
    async def server_metadata() -> Response:
        return _json(service.server_metadata())

    @app.get("/v2/kubeinfer/startup")
    async def startup() -> Response:
        return _json(service.startup())

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200 if service.live() else 503)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if service.ready() else 503)

    # ---- statistics (before /v2/models/{name} so "stats" is not taken for a model name) -------
    @app.get("/v2/models/stats")
    async def all_stats() -> Response:
        return _json(service.statistics())

    @app.get("/v2/models/{name}/stats")
    async def model_stats(name: str) -> Response:
        return _json(service.statistics(name))

    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def version_stats(name: str, version: str) -> Response:
        _numeric(version)
        return _json(service.statistics(name, version))

    # ---- model metadata, readiness, config ----------------------------------------------------
    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> Response:
        await service.ensure_loaded(name)
        return _json(service.model_metadata(name))

    @app.get("/v2/models/{name}/versions/{version}")
    async def version_metadata(name: str, version: str) -> Response:
        _numeric(version)
        await service.ensure_loaded(name, version)
        return _json(service.model_metadata(name, version))

    # Triton (2.51) answers a model that is not ready, known or not, 400 {"error":"Model version not ready"}
    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> Response:
        return Response(status_code=200) if service.model_ready(name) else _error(NOT_READY, 400)

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def version_ready(name: str, version: str) -> Response:
        _numeric(version)
        return Response(status_code=200) if service.model_ready(name, version) else _error(NOT_READY, 400)

    @app.get("/v2/models/{name}/config")
    async def model_config(name: str) -> Response:
        await service.ensure_loaded(name)
        return Response(service.model_config_json(name).encode(), media_type=JSON)

    @app.get("/v2/models/{name}/versions/{version}/config")
    async def version_config(name: str, version: str) -> Response:
        _numeric(version)
        await service.ensure_loaded(name, version)
        return Response(service.model_config_json(name, version).encode(), media_type=JSON)

    # inference (POST .../infer) is served by InferRoute in front of this app: see infer_route.py

    # ---- generate extension (decoupled models, LLM clients): see generate.py ------------------
    @app.post("/v2/models/{name}/generate")
    async def generate_one(name: str, request: Request) -> Response:
        return await generate(service, name, "", request, streaming=False)

    @app.post("/v2/models/{name}/versions/{version}/generate")
    async def version_generate_one(name: str, version: str, request: Request) -> Response:
        _numeric(version)
        return await generate(service, name, version, request, streaming=False)

    @app.post("/v2/models/{name}/generate_stream")
    async def generate_stream(name: str, request: Request) -> Response:
        return await generate(service, name, "", request, streaming=True)

    @app.post("/v2/models/{name}/versions/{version}/generate_stream")
    async def version_generate_stream(name: str, version: str, request: Request) -> Response:
        _numeric(version)
        return await generate(service, name, version, request, streaming=True)

    _add_shared_memory_routes(app, shm)

    # ---- trace and logging extensions (docs/protocol/extension_trace.md, extension_logging.md) --
    # one route per path for GET and POST, so that a 405 lists both in Allow
    @app.api_route("/v2/trace/setting", methods=["GET", "POST"])
    async def trace_setting(request: Request) -> Response:
        if request.method == "GET":
            return _json(service.trace_settings())
        return _json(service.update_trace_settings(await _json_body(request)))

    @app.api_route("/v2/models/{name}/trace/setting", methods=["GET", "POST"])
    async def model_trace_setting(name: str, request: Request) -> Response:
        if request.method == "GET":
            return _json(service.trace_settings(name))
        return _json(service.update_trace_settings(await _json_body(request), name))

    @app.api_route("/v2/logging", methods=["GET", "POST"])
    async def logging_settings(request: Request) -> Response:
        if request.method == "GET":
            return _json(service.log_settings())
        return _json(service.update_log_settings(await _json_body(request)))

    # ---- repository extension ----------------------------------------------------------------
    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> Response:
        body = await _json_body(request)
        return _json(service.repository_index(_flag(body, "ready")))

    @app.post("/v2/repository/poll")
    async def repository_poll(request: Request) -> Response:
        body = await _json_body(request)
        names = body.get("models")
        if names is not None and (
            not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(names) > MAX_POLLED
        ):
            raise InvalidArgument(f"'models' must be a list of at most {MAX_POLLED} model names")
        return _json(await service.poll_repository(names))

    # {name:path}: a name with "/" reaches the handler and gets a 400 from the name check, not a bare 404
    @app.post("/v2/repository/models/{name:path}/load")
    async def load(name: str, request: Request) -> Response:
        await service.load_with_parameters(name, _parameters(await _json_body(request)))
        return Response(status_code=200)

    @app.post("/v2/repository/models/{name:path}/unload")
    async def unload(name: str, request: Request) -> Response:
        params = _parameters(await _json_body(request))
        await service.unload_model(name, _flag(params, "unload_dependents"))
        return Response(status_code=200)

    return app
