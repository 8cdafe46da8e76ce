"""The Vertex AI listener (``--allow-vertex-ai``, port ``--vertex-ai-port``), as Triton's ``src/vertex_ai_server.cc``.

- ``$AIP_HEALTH_ROUTE`` (a regular expression, as Triton): the server's readiness, as ``/v2/health/ready``.
- ``$AIP_PREDICT_ROUTE``, POST: a KServe v2 inference request for the default model (``--vertex-ai-default-model``,
  or the repository's only ready model). Binary tensors are announced by ``Content-Type:
  application/vnd.vertex-ai-triton.binary+json;json-header-size=<N>``; answers are the HTTP front end's.
- ``$AIP_PREDICT_ROUTE`` with the header ``X-Vertex-Ai-Triton-Redirect: <endpoint>``: the v2 endpoint it
  names (``v2/models/m/infer``, ``v2/models/m/config``, ``v2/health/ready``, ``v2/repository/index``, ``metrics``
  ...), answered as on the HTTP listener; the request must be a POST (405 otherwise), Triton's handlers are
  called with the method they expect.
- Anything else: 400 with an empty body, as Triton.

Triton starts this listener after the models loaded (it picks the default model then); so does ``app.py``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .cloud_frontend import authorized, infer, respond, rewritten
from .infer_route import InferRoute, Receive, Scope, Send, _respond

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT_HEADER = b"x-vertex-ai-triton-redirect"
#: Triton's http_server.h route expressions the redirect is matched against
MODEL_PATH = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
SERVER_HEALTH = re.compile(r"/v2/health/(live|ready)")
SYSTEM_SHM = re.compile(r"/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
CUDA_SHM = re.compile(r"/v2/cudasharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
MODEL_CONTROL = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")

ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


def routes(environ: dict[str, str]) -> tuple[str, str]:
    """(predict route, health route) from ``AIP_PREDICT_ROUTE``/``AIP_HEALTH_ROUTE``; ValueError in Triton's words."""
    predict = environ.get("AIP_PREDICT_ROUTE", "")
    health = environ.get("AIP_HEALTH_ROUTE", "")
    if not predict:
        raise ValueError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")  # (sic, Triton's text)
    if not health:
        raise ValueError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
    return predict, health


def default_model(ready_models: list[str], configured: str) -> str:
    """Triton's ``VertexAiAPIServer::Create``: the configured model must be ready; none configured, the repository
    must hold exactly one ready model. ValueError with Triton's text otherwise."""
    if not configured:
        if len(ready_models) != 1:
            raise ValueError(
                "Expect the model repository contains only a single model if default model is not specified"
            )
        return ready_models[0]
    if configured not in ready_models:
        raise ValueError(f"Expect the default model '{configured}' is loaded")
    return configured


class VertexAiApp:
    """ASGI app of the Vertex AI listener over the HTTP front end ``route`` (and the metrics app, if any)."""

    def __init__(
        self, route: InferRoute, predict_route: str, health_route: str, model: str, metrics: ASGIApp | None = None
    ) -> None:
        self.route = route
        self.predict = re.compile(predict_route)
        self.health = re.compile(health_route)
        self.model = model
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if self.health.fullmatch(path):
            await self.route(rewritten(scope, "/v2/health/ready"), receive, send)  # GET only, as Triton
            return
        if not self.predict.fullmatch(path):
            await respond(send, 400)
            return
        redirect = next((v for k, v in scope["headers"] if k == REDIRECT_HEADER), None)
        if redirect is None:
            if method != "POST":
                await respond(send, 405)
            elif await authorized(self.route, scope, send):
                await self._infer(scope, receive, send, self.model, "")
            return
        if method != "POST":
            await respond(send, 405)
            return
        await self._redirect("/" + redirect.decode("latin-1"), scope, receive, send)

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str, version: str) -> None:
        answer = await infer(self.route, scope, receive, name, version, BINARY_MIME)
        if answer is not None:
            await _respond(send, *answer)

    async def _redirect(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Triton's ``Handle``: the handler the endpoint names, with the method that handler expects."""
        if endpoint == "/metrics":
            if self.metrics is not None and await authorized(self.route, scope, send):
                await self.metrics(rewritten(scope, "/metrics", "GET"), receive, send)
            elif self.metrics is None:
                await respond(send, 400)  # no metrics (--allow-metrics=false)
            return
        if endpoint == "/v2/models/stats":
            await self.route(rewritten(scope, endpoint, "GET"), receive, send)
            return
        match = MODEL_PATH.fullmatch(endpoint)
        if match is not None:
            kind = match.group(3) or ""
            if kind == "infer":
                if await authorized(self.route, scope, send):
                    await self._infer(scope, receive, send, match.group(1), match.group(2) or "")
                return
            if kind in ("", "ready", "config", "stats"):
                await self.route(rewritten(scope, endpoint, "GET"), receive, send)
                return
        if endpoint == "/v2" or SERVER_HEALTH.fullmatch(endpoint):
            await self.route(rewritten(scope, endpoint, "GET"), receive, send)
            return
        shm = SYSTEM_SHM.fullmatch(endpoint) or CUDA_SHM.fullmatch(endpoint)
        if shm is not None:
            await self.route(rewritten(scope, endpoint, "GET" if shm.group(2) == "status" else "POST"), receive, send)
            return
        if MODEL_CONTROL.fullmatch(endpoint):
            await self.route(rewritten(scope, endpoint, "POST"), receive, send)
            return
        await respond(send, 400)
