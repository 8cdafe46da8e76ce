"""Inference requests served straight from the HTTP protocol, without an ASGI cycle.

The plain case of ``POST /v2/models/{m}[/versions/{v}]/infer`` (HTTP/1.1, a Content-Length within the
limit, no ``Expect``, no upgrade, nothing pipelined ahead of it, the server not draining) is answered here:
the body is collected from the parser's callbacks, ``InferRoute.answer`` computes the response, and its
status line, headers and body leave in one ``write()``. What this skips per request is uvicorn's ASGI
machinery: the RequestResponseCycle and its Event, the proxy-headers middleware, the ``receive``/``send``
message dicts and uvicorn's per-header checks, and the disconnect timer (a closed connection is seen in
``connection_lost`` directly). Everything else (other routes, bodies over the limit,
authentication failures, chunked or compressed bodies, HTTP/1.0, draining, past --http-max-connections) takes
the ASGI route, which answers it as before. ``paths.InferPaths`` counts the requests each way answered.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from ..observability import otel
from ..vocabulary.types import InferenceRequest
from .response_head import answer_headers, head

if TYPE_CHECKING:
    from .infer_route import InferRoute
    from .protocol import BoundedHttpToolsProtocol

#: the infer route as raw request-target bytes: ASCII, no query, no percent-escapes (those take the ASGI route)
INFER_TARGET = re.compile(rb"/v2/models/([^/?#%\x80-\xff]+)(?:/versions/([0-9]+))?/infer")


class _NoEvent:
    """uvicorn's ``connection_lost`` sets ``cycle.message_event``; this cycle has nobody waiting on one."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class InferCycle:
    """One request on the direct path; it stands in ``protocol.cycle`` where uvicorn keeps its own cycles, so
    uvicorn's pipelining, shutdown and connection-lost handling treat it as one of them."""

    __slots__ = (
        "protocol",
        "route",
        "name",
        "version",
        "header_length",
        "chunks",
        "keep_alive",
        "response_complete",
        "disconnected",
        "gone",
        "request",
        "trace_context",
        "task",
    )
    message_event = _NO_EVENT

    def __init__(
        self,
        protocol: BoundedHttpToolsProtocol,
        route: InferRoute,
        name: str,
        version: str,
        header_length: str | None,
        keep_alive: bool,
    ) -> None:
        self.protocol = protocol
        self.route = route
        self.name = name
        self.version = version
        self.header_length = header_length
        self.chunks: list[bytes] = []
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.gone = False
        self.request: InferenceRequest | None = None
        #: the caller's W3C trace context (--trace-config mode=opentelemetry)
        self.trace_context: tuple[str | bytes, str | bytes | None] | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The whole body arrived: compute the answer in a task that uvicorn's shutdown waits for."""
        protocol = self.protocol
        task = protocol.loop.create_task(self.run())
        task.add_done_callback(protocol.tasks.discard)
        protocol.tasks.add(task)
        self.task = task

    # the disconnect watch InferRoute.answer asks for: this cycle itself
    def watch(self, request: InferenceRequest) -> InferCycle:
        self.request = request
        return self

    def stop(self) -> None:
        self.request = None

    def client_gone(self) -> None:
        """The connection closed before the answer: the request is marked cancelled (``is_cancelled()`` in
        the model, dropped unexecuted while queued) and its task cancelled, as Triton's ``RequestFiniHook``."""
        if self.response_complete:
            return
        self.disconnected = True
        if self.request is not None:
            self.gone = True
            self.request.cancelled = True
            if self.task is not None:
                self.task.cancel()

    async def run(self) -> None:
        protocol = self.protocol
        self.route.paths.direct += 1
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        if self.trace_context is not None:
            otel.incoming(*self.trace_context)
        try:
            answer = await self.route.answer(self.name, self.version, self.header_length, body, self.watch)
            if answer is None or self.disconnected:
                return
            if protocol.flow.write_paused:
                await protocol.flow.drain()
                if self.disconnected:
                    return
            protocol.transport.write(self._message(*answer))
        except BaseException:
            protocol.transport.close()  # as uvicorn does when an ASGI task fails after its response started
            raise
        finally:
            self.response_complete = True
            if not self.keep_alive:
                protocol.transport.close()
            protocol.on_response_complete()

    def _message(self, status: int, payload: bytes, json_length: int | None) -> bytes:
        """The response bytes: uvicorn's default headers (date, server), then the head the ASGI route sends."""
        headers = answer_headers(len(payload), json_length, not self.keep_alive)
        return head(status, self.protocol.server_state.default_headers, headers, payload)


def direct_cycle(protocol: BoundedHttpToolsProtocol, route: InferRoute) -> InferCycle | None:
    """An ``InferCycle`` for the request whose head was just parsed, or None when the ASGI route must answer it."""
    existing = protocol.cycle
    if existing is not None and not existing.response_complete:
        return None  # pipelined behind a request still being answered: uvicorn queues it
    parser = protocol.parser
    if protocol.expect_100_continue or parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
        return None
    match = INFER_TARGET.fullmatch(protocol.url)
    if match is None or parser.should_upgrade() or route.service.closing_connections:
        return None
    length = -1
    header_length = authorization = None
    for key, value in protocol.headers:
        if key == b"content-length":
            if not value.isdigit():
                return None
            length = int(value)
        elif key == b"inference-header-content-length":
            header_length = value.decode("latin-1")
        elif key == b"transfer-encoding" or key == b"content-encoding":
            return None  # chunked or compressed: the ASGI route reads and decodes it
        elif key == b"authorization":
            authorization = value
    if length < 0 or length > route.max_body:
        return None  # no length (chunked) or over the limit: the ASGI route refuses it with a 413
    if route.token is not None and not route.token.accepts(authorization):
        return None  # the ASGI route answers the 401
    version = match.group(2)
    cycle = InferCycle(
        protocol,
        route,
        match.group(1).decode("ascii"),
        version.decode("ascii") if version else "",
        header_length,
        parser.should_keep_alive(),
    )
    if otel.propagation:
        cycle.trace_context = otel.carried(protocol.headers)
    return cycle
