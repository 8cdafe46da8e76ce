"""The inference route as a bare ASGI handler in front of the FastAPI app.

``POST /v2/models/{m}[/versions/{v}]/infer`` is the only hot path, so it skips FastAPI's router,
middleware stack and Request/Response objects: the body is read straight from ``receive`` and the
answer written with two ``send`` calls. Every other route stays in FastAPI, whose routing costs more per
request than the inference itself on a small model.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Protocol

from ..observability import otel
from ..runtime.auth import PROBE_PATHS, BearerToken
from ..runtime.service import InferenceService
from ..sharedmemory import SharedMemoryRegistry
from ..vocabulary.errors import DecoupledModelCall, ServerError, internal_error_message
from ..vocabulary.limits import DEFAULT_LIMITS, Limits, body_too_large
from ..vocabulary.types import InferenceRequest
from .codec import HEADER_LENGTH, decode_request, encode_response, error_body
from .content_encoding import ACCEPTED, INLINE_BELOW, UnsupportedEncoding, decode_body
from .paths import InferPaths
from .response_head import Header, answer_headers

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# numeric versions only, as Triton's route: /versions/x/infer is an unknown route (404 "Not Found")
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
_HEADER_LENGTH = HEADER_LENGTH.encode()
#: methods whose body the FastAPI routes may read: buffered here first, under the body limit
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class InferRoute:
    """Serves inference itself and hands every other request to ``app``; enforces the body limit for both."""

    def __init__(
        self,
        app: ASGIApp,
        service: InferenceService,
        limits: Limits = DEFAULT_LIMITS,
        token: BearerToken | None = None,
        shm: SharedMemoryRegistry | None = None,
    ) -> None:
        self.app = app
        self.service = service
        self.max_body = limits.http_max_input_size
        self.limits = limits
        self.token = token
        self.shm = shm
        #: inference requests answered per path (this route or the protocol's direct path), a metric
        self.paths = InferPaths()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.service.closing_connections:
            send = _closing(send)
        if self.token is not None and scope["path"] not in PROBE_PATHS:
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not self.token.accepts(authorization):
                await _respond(
                    send,
                    401,
                    error_body("this server requires 'Authorization: Bearer <token>' (see --auth-token-file)"),
                    None,
                    extra=[(b"www-authenticate", b"Bearer")],
                )
                return
        header_length = content_encoding = length = None
        chunked = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = value
            elif key == _HEADER_LENGTH:
                header_length = value.decode("latin-1")
            elif key == b"content-encoding":
                content_encoding = value
            elif key == b"transfer-encoding":
                chunked = True  # the body is chunked; a Content-Length beside it says nothing (RFC 9112 6.1)
        if length is not None and not chunked and length.isdigit() and int(length) > self.max_body:
            # refused before a byte of the body is read
            await _respond(send, 413, error_body(body_too_large(int(length), self.max_body).message), None, True)
            return
        method = scope["method"]
        if method == "POST":
            if otel.propagation:  # the caller's W3C trace context, for --trace-config mode=opentelemetry
                otel.from_headers(scope["headers"])
            match = INFER_PATH.match(scope["path"])
            if match is not None:
                await self._infer(match.group(1), match.group(2) or "", header_length, content_encoding, receive, send)
                return
        if method in _BODY_METHODS:
            try:
                body = await _read_body(receive, self.max_body)
            except ConnectionAbortedError:
                return
            except ServerError as exc:
                await _respond(send, exc.http_status, error_body(exc.message), None, True)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _infer(
        self,
        name: str,
        version: str,
        header_length: str | None,
        content_encoding: bytes | None,
        receive: Receive,
        send: Send,
    ) -> None:
        self.paths.asgi += 1
        try:
            body = await _read_body(receive, self.max_body)
            if content_encoding is not None:
                if len(body) < INLINE_BELOW:
                    body = decode_body(body, content_encoding, self.max_body)
                else:  # inflating up to --http-max-input-size takes a while: not on the event loop
                    body = await asyncio.to_thread(decode_body, body, content_encoding, self.max_body)
        except ConnectionAbortedError:
            return  # nobody to answer
        except UnsupportedEncoding as exc:  # Triton: 415 with the codings it reads
            await _respond(send, 415, error_body(str(exc)), None, extra=[(b"accept-encoding", ACCEPTED)])
            return
        except ServerError as exc:
            await _respond(send, exc.http_status, error_body(exc.message), None, True)
            return
        answer = await self.answer(
            name, version, header_length, body, lambda request: _DisconnectWatch(request, receive)
        )
        if answer is not None:
            await _respond(send, *answer)

    async def answer(
        self,
        name: str,
        version: str,
        header_length: str | None,
        body: bytes,
        watch: Callable[[InferenceRequest], Watch],
    ) -> tuple[int, bytes, int | None] | None:
        """(status, payload, JSON header length when binary parts follow) for one inference request's body;
        None when the client went away. ``watch`` starts watching the decoded request for a closed connection.

        Both ways in use it: this ASGI route and the protocol's direct path (``fast_infer``), so the two answer
        every request, error texts included, the same way.
        """
        guard = None
        try:
            if header_length is not None and header_length.strip() == "0" and body:
                # raw binary request: the body is the one input's bytes, outputs come back binary
                await self.service.ensure_loaded(name, version)  # its config decodes the body
                request = self.service.raw_request(name, version, body)
                options: dict[str, Any] = {"__default_binary__": True}
            else:
                request, options = decode_request(body, header_length, name, version, self.limits, self.shm)
            guard = watch(request)
            response = await self.service.infer(request)
            payload, json_length = encode_response(response, options, self.shm)
        except DecoupledModelCall:
            return 501, error_body(DecoupledModelCall.HTTP_MESSAGE), None
        except asyncio.CancelledError:
            if guard is not None and guard.gone:
                return None  # the client closed the connection: nobody to answer
            raise
        except ServerError as exc:
            return exc.http_status, error_body(exc.message), None
        except Exception as exc:  # a bug must answer 500, never drop the connection
            log.exception("inference request failed")
            return 500, error_body(internal_error_message(exc)), None
        finally:
            if guard is not None:
                guard.stop()
        return 200, payload, json_length


class Watch(Protocol):
    """What ``InferRoute.answer`` needs from a disconnect watch."""

    gone: bool

    def stop(self) -> None: ...


class _DisconnectWatch:
    """Cancels a request whose client closed the connection (Triton's ``RequestFiniHook``).

    Once the body is read, ``receive()`` returns only ``http.disconnect``; waiting on it costs a task, so
    the wait starts only if the request is still running after ``AFTER`` seconds: a timer handle is all
    that quick requests pay. The request is marked cancelled (``is_cancelled()`` in the model) and the
    handler task cancelled, so a request still queued never executes.
    """

    AFTER = 0.05

    def __init__(self, request: InferenceRequest, receive: Receive) -> None:
        self.request = request
        self.receive = receive
        self.gone = False
        self.task = asyncio.current_task()
        self.waiting: asyncio.Task[None] | None = None
        self.timer = asyncio.get_running_loop().call_later(self.AFTER, self._start)

    def _start(self) -> None:
        self.waiting = asyncio.ensure_future(self._wait())

    async def _wait(self) -> None:
        message = await self.receive()
        if message["type"] == "http.disconnect" and self.task is not None:
            self.gone = True
            self.request.cancelled = True
            self.task.cancel()

    def stop(self) -> None:
        self.timer.cancel()
        if self.waiting is not None:
            self.waiting.cancel()


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, refusing (PayloadTooLarge) as soon as more than ``limit`` bytes arrived."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # a chunked body that never said how long it is
            raise body_too_large(f"more than {limit}", limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body over once, then waits for the disconnect."""
    sent = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _respond(
    send: Send,
    status: int,
    payload: bytes,
    json_length: int | None,
    close: bool = False,
    extra: Sequence[Header] = (),
) -> None:
    """An answer through uvicorn: the head ``response_head`` decides (``close``: the rest of an oversized body
    is not read, so the connection cannot be reused), then the payload."""
    headers = answer_headers(len(payload), json_length, close, extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` on the response: the client's next request opens a new connection,
    which a Service routes to a replica that is not stopping (uvicorn closes the connection after it)."""

    async def closing_send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing_send
