"""The inference route as a bare ASGI handler in front of the FastAPI app.

``POST /v2/models/{m}[/versions/{v}]/infer`` is the only hot path, so it skips FastAPI's router,
middleware stack and Request/Response objects: the body is read straight from ``receive`` and the
answer written with two ``send`` calls. Every other route stays in FastAPI. Measured on add_sub at
concurrency 16 in one sitting: 2,966–3,701 req/s this way against 1,347 req/s through FastAPI routes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..runtime.service import InferenceService
from ..vocabulary.errors import ServerError, internal_error_message
from .codec import HEADER_LENGTH, decode_request, encode_response, error_body

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
_HEADER_LENGTH = HEADER_LENGTH.encode()


class InferRoute:
    """Serves inference itself and hands every other request to ``app``."""

    def __init__(self, app: ASGIApp, service: InferenceService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = INFER_PATH.match(scope["path"])
            if match is not None:
                await self._infer(match.group(1), match.group(2) or "", scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _infer(self, name: str, version: str, scope: Scope, receive: Receive, send: Send) -> None:
        header_length = None
        for key, value in scope["headers"]:
            if key == _HEADER_LENGTH:
                header_length = value.decode("latin-1")
                break
        try:
            body = await _read_body(receive)
        except ConnectionAbortedError:
            return  # nobody to answer
        try:
            request, options = decode_request(body, header_length, name, version)
            response = await self.service.infer(request)
            payload, json_length = encode_response(response, options)
        except ServerError as exc:
            await _respond(send, exc.http_status, error_body(exc.message), None)
            return
        except Exception as exc:  # a bug must answer 500, never drop the connection
            log.exception("inference request failed")
            await _respond(send, 500, error_body(internal_error_message(exc)), None)
            return
        await _respond(send, 200, payload, json_length)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("client disconnected")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _respond(send: Send, status: int, payload: bytes, json_length: int | None) -> None:
    headers = [(b"content-length", str(len(payload)).encode())]
    if json_length is None:
        headers.append((b"content-type", b"application/json"))
    else:
        headers.append((b"content-type", b"application/octet-stream"))
        headers.append((b"inference-header-content-length", str(json_length).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
