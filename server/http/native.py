"""The HTTP listener on the native transport: requests queued by the Rust extension → the ASGI application.

``HttpTransport`` (grpc/rust/src/http1.rs, in the same extension module as the gRPC transport) is hyper's
HTTP/1.1 server on its own thread; it never takes the GIL. It enforces the listener's limits itself (head size
431, head and body time, body size 413 before a byte of an oversized body is read, the connection cap 503, the
idle time of kept-alive connections) and hands each complete request — method, target, headers, body — to this
event loop through the hand-off the gRPC transport uses: a queue and an eventfd, drained in one GIL
acquisition.

Each request is served by calling the application through public ASGI only (a scope, ``receive`` and
``send``): the whole HTTP surface at once, the same application uvicorn runs on the ``asgi`` transport.
The plain inference request (``POST /v2/models/{m}[/versions/{v}]/infer``, no Content-Encoding, its token
accepted, the server not draining, no OpenTelemetry propagation) skips ASGI: ``InferRoute.answer``, the code
both of uvicorn's ways in call, computes its answer, with the headers ``response_head.answer_headers`` says
(the direct path's, ``fast_infer``, without its uvicorn protocol).
A response that ends in its first body message goes back whole; one that announces more (server-sent
events) is streamed chunk by chunk. A client that goes away cancels its request's task, and ``receive``
then says ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ..grpc.kubeinfer_grpc_transport import HttpTransport, PendingRequest
from ..observability import otel
from ..vocabulary.limits import Limits
from ..vocabulary.types import InferenceRequest
from .codec import error_body
from .fast_infer import INFER_TARGET
from .infer_route import InferRoute
from .response_head import answer_headers

log = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Asgi = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

#: seconds a kept-alive connection may stay without a request (uvicorn's timeout_keep_alive in app._uvicorn)
KEEP_ALIVE_SECONDS = 75.0
#: after stop, seconds the requests in flight get before they are cancelled (uvicorn's timeout_graceful_shutdown)
GRACE_SECONDS = 5.0
#: tokio worker threads (as the gRPC transport's: a second one bought nothing on 2 cores)
THREADS = 1
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_INTERNAL = error_body("Internal Server Error")


class _Exchange:
    """One request's ASGI conversation: ``receive`` gives the body, then waits for the disconnect; ``send``
    answers whole (one body message) or streamed (several)."""

    __slots__ = ("pending", "body", "gone", "status", "headers", "streaming", "done")

    def __init__(self, pending: PendingRequest, body: bytes) -> None:
        self.pending = pending
        self.body: bytes | None = body
        self.gone = asyncio.Event()  # the client left, or the response is complete
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.streaming = False
        self.done = False

    async def receive(self) -> Message:
        body = self.body
        if body is not None:
            self.body = None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body" or self.done:
            return
        body = bytes(message.get("body", b""))
        pending = self.pending
        if message.get("more_body", False):
            if not self.streaming:
                self.streaming = True
                if not pending.start(self.status, self.headers):
                    raise OSError("the client went away")
            if body and not pending.send(body):
                raise OSError("the client went away")
            return
        if self.streaming:
            if body:
                pending.send(body)
            pending.finish()
        else:
            pending.respond(self.status, self.headers, body)  # (headers it refuses raise: answered 500)
        self.done = True
        self.gone.set()


@dataclass
class ListenerConfig:
    """The part of ``uvicorn.Config`` ``app.ServerProcess`` reads: the port (the bound one once started)."""

    port: int


class _Direct:
    """A plain inference request answered without ASGI; also its disconnect watch (``InferRoute.answer``'s)."""

    __slots__ = ("pending", "request", "gone", "task")

    def __init__(self, pending: PendingRequest) -> None:
        self.pending = pending
        self.request: InferenceRequest | None = None
        self.gone = False
        self.task: asyncio.Task[None] | None = None

    def watch(self, request: InferenceRequest) -> _Direct:
        self.request = request
        return self

    def stop(self) -> None:
        self.request = None

    def client_gone(self) -> None:
        """The client left before the answer: the request is marked cancelled (dropped unexecuted while
        queued) and its task cancelled, as on the direct path (fast_infer.InferCycle.client_gone)."""
        if self.request is not None:
            self.gone = True
            self.request.cancelled = True
            if self.task is not None:
                self.task.cancel()


def _direct_target(route: InferRoute, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> Any:
    """(model, version, inference-header-content-length) for a request the direct answer serves, else None."""
    if method != "POST" or route.service.closing_connections or otel.propagation:
        return None
    match = INFER_TARGET.fullmatch(path.encode("latin-1"))
    if match is None:
        return None
    header_length = authorization = None
    for key, value in headers:
        if key == b"inference-header-content-length":
            header_length = value.decode("latin-1")
        elif key == b"content-encoding":
            return None  # the ASGI route decodes it
        elif key == b"authorization":
            authorization = value
    if route.token is not None and not route.token.accepts(authorization):
        return None  # the ASGI route answers the 401
    version = match.group(2)
    return match.group(1).decode("ascii"), version.decode("ascii") if version else "", header_length


class NativeHttpServer:
    """An HTTP listener on the native transport, with the part of ``uvicorn.Server``'s interface
    ``app.ServerProcess`` uses: ``serve()`` (returns once stopped), ``started``, ``should_exit``, ``config``."""

    def __init__(self, app: Asgi, host: str, port: int, limits: Limits) -> None:
        self.app = app
        self.host = host
        self.config = ListenerConfig(port)
        self.limits = limits
        self.started = False
        self.transport: HttpTransport | None = None
        #: the inference route, when ``app`` is one: its plain requests skip ASGI
        self.route = app if isinstance(app, InferRoute) else None
        self.inflight: dict[int, tuple[asyncio.Task[None], _Exchange | _Direct]] = {}
        self._exit = asyncio.Event()

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()

    async def serve(self) -> None:
        """Listens until ``should_exit``; a port that cannot be bound is logged and returns at once."""
        limits = self.limits
        try:
            transport = HttpTransport(
                self.host,
                self.config.port,
                threads=THREADS,
                max_body_bytes=limits.http_max_input_size,
                max_header_bytes=limits.max_header_bytes,
                header_timeout_ms=round(limits.http_header_timeout * 1000),
                body_timeout_ms=round(limits.http_body_timeout * 1000),
                idle_timeout_ms=round(KEEP_ALIVE_SECONDS * 1000),
                max_connections=limits.http_max_connections,
            )
        except OSError as exc:
            log.error("%s", exc)
            return
        self.transport = transport
        self.config.port = transport.port
        loop = asyncio.get_running_loop()
        loop.add_reader(transport.fd, self._drain, loop)
        self.started = True
        log.info("HTTP listening on %s:%d (native transport)", self.host, transport.port)
        try:
            await self._exit.wait()
        finally:
            await self._stop(loop, transport)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Everything the transport queued since the last wake-up, in one call into it."""
        transport = self.transport
        if transport is None:
            return
        requests, cancelled = transport.take()
        server = (self.host, self.config.port)
        inflight = self.inflight
        route = self.route
        for pending, method, target, headers, body, client in requests:
            path, _, query = target.partition("?")
            direct = None if route is None or query else _direct_target(route, method, path, headers)
            if direct is not None and route is not None:
                answer = _Direct(pending)
                answer.task = loop.create_task(self._answer(route, answer, direct, body, pending.id))
                inflight[pending.id] = (answer.task, answer)
                continue
            scope = {
                "type": "http",
                "asgi": _ASGI,
                "http_version": "1.1",
                "method": method,
                "scheme": "http",
                "path": unquote(path),
                "raw_path": path.encode("latin-1"),
                "query_string": query.encode("latin-1"),
                "root_path": "",
                "headers": headers,
                "client": client,
                "server": server,
                "state": {},
            }
            exchange = _Exchange(pending, body)
            inflight[pending.id] = (loop.create_task(self._serve_one(scope, exchange, pending.id)), exchange)
        for request_id in cancelled:
            entry = inflight.pop(request_id, None)
            if entry is None:
                continue
            task, waiting = entry
            if isinstance(waiting, _Direct):
                waiting.client_gone()
            else:
                waiting.gone.set()
                task.cancel()

    async def _answer(
        self, route: InferRoute, direct: _Direct, target: tuple[str, str, str | None], body: bytes, request_id: int
    ) -> None:
        name, version, header_length = target
        route.paths.direct += 1
        try:
            answer = await route.answer(name, version, header_length, body, direct.watch)
            if answer is not None:
                status, payload, json_length = answer
                direct.pending.respond(status, answer_headers(len(payload), json_length), payload)
        finally:
            self.inflight.pop(request_id, None)

    async def _serve_one(self, scope: MutableMapping[str, Any], exchange: _Exchange, request_id: int) -> None:
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except OSError:
            pass  # the client went away while a stream was written
        except Exception:
            log.exception("Exception in ASGI application")
        finally:
            if exchange.streaming:
                exchange.pending.finish()  # (an application that stopped mid-stream: the chunked body ends)
            elif not exchange.done:  # failed, or returned without an answer: uvicorn's 500 (a no-op if gone)
                exchange.pending.respond(
                    500, [(b"content-type", b"application/json"), (b"connection", b"close")], _INTERNAL
                )
            exchange.gone.set()
            self.inflight.pop(request_id, None)

    async def _stop(self, loop: asyncio.AbstractEventLoop, transport: HttpTransport) -> None:
        transport.close()  # the listener closes; connections end after their request in flight
        tasks = [task for task, _ in self.inflight.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=GRACE_SECONDS)
        for task, _ in list(self.inflight.values()):
            task.cancel()
        loop.remove_reader(transport.fd)
        requests, wakeups = transport.stats()
        log.info("HTTP (native transport): %d requests in %d event-loop wake-ups", requests, wakeups)
        await asyncio.to_thread(transport.shutdown, 2.0)
