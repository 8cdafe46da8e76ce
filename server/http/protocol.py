"""uvicorn's httptools protocol with the bounds a server facing any client needs, and the direct path.

* **Head size**: uvicorn's httptools protocol accepts headers of any size (a 10 MB header was answered 200
  here), and httptools has no setting for it, so this subclass answers 431 when a head passes
  ``--max-header-bytes``, before the request reaches the application. Two counts: the parsed URL and
  headers (exact, checked when the head is complete), and the raw bytes received while a head is still
  incomplete (so a head that never ends cannot grow without bound; this one may let one socket read past
  the limit). uvicorn's h11 protocol, used when httptools is missing, has ``h11_max_incomplete_event_size``
  for the same purpose; ``app`` sets both.
* **Slow clients** (slowloris): a request's head must be complete within ``--http-header-timeout``
  seconds of its first byte (of the connection opening, for the first request), and its body within
  ``--http-body-timeout`` seconds of the head; otherwise 408 and the connection closes. uvicorn bounds
  only the idle time between requests (``timeout_keep_alive``).
* **Connections**: past ``--http-max-connections`` open connections, a request is answered 503 with
  ``Connection: close`` (uvicorn's ``limit_concurrency`` rule, with our error body), on the direct path too.
* **Transfer-Encoding with Content-Length**: what ``requests`` sends for a manually chunked body. llhttp
  refuses it (400) where Triton reads the body as chunked; RFC 9112 6.1 allows either, if the connection
  is closed after the response (no request smuggling through it), so that is what this does.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..vocabulary.limits import DEFAULT_LIMITS, Limits
from .codec import error_body
from .fast_infer import InferCycle, direct_cycle
from .response_head import answer_headers, head

if TYPE_CHECKING:
    from .infer_route import InferRoute


class _HeadTooLarge(Exception):
    pass


#: seconds between two looks at the connections' head and body deadlines: a timeout fires up to this late.
#: One timer per listener rather than one per request phase: call_later + cancel, twice per request on the
#: direct path, cost far more than storing a deadline (a loop.time() call)
SWEEP_EVERY = 0.5


class OneWriteResponses:
    """The transport as one response cycle sees it: the head of a response with a Content-Length waits for
    its body, so the response leaves in one ``write()``.

    uvicorn writes the status line and headers at ``http.response.start`` and the body at
    ``http.response.body``: two system calls per response, a large share of the event loop's busy time on a
    small model (README 'Performance against Triton and MLServer'). Chunked responses (streams) are written as
    they come, so a stream's head is never held back waiting for its first event.
    """

    __slots__ = ("_transport", "_head", "_joined")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._joined = False  # once the head went out, later writes are body bytes: never held, never parsed

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._joined = True
            self._transport.write(head + data)
        elif (
            not self._joined
            and data[:5] == b"HTTP/"
            and b"\r\ncontent-length: " in data
            and b"\r\ntransfer-encoding:" not in data
        ):
            self._head = data
        else:
            self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:  # a head without its body: what there is goes out before the close
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Overloaded:
    """The ASGI answer past ``--http-max-connections``: 503, the connection closed after it."""

    def __init__(self, cap: int) -> None:
        self.body = error_body(
            f"the server has more than {cap} HTTP connections open (--http-max-connections): try again later"
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = answer_headers(len(self.body), close=True, extra=[(b"retry-after", b"1")])
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    #: --max-header-bytes (set on each listener's own class)
    max_header_bytes = DEFAULT_LIMITS.max_header_bytes
    #: the inference route answered straight from the parser's callbacks (fast_infer); None: ASGI only
    infer_route: InferRoute | None = None
    #: --http-header-timeout, --http-body-timeout, --http-max-connections (0: none)
    limits: Limits = DEFAULT_LIMITS
    overloaded = _Overloaded(DEFAULT_LIMITS.http_max_connections)
    #: the listener's deadline sweep while a connection has a deadline (set on each listener's own class)
    sweeper: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._raw_head = 0  # bytes received since the head began
        self._head = 0  # URL and header bytes parsed
        self._too_large = False
        self.direct: InferCycle | None = None  # the last request answered by the direct path
        #: loop time by which the head or body being received must be complete (0: none), and which one
        self._deadline = 0.0
        self._receiving = "head"
        # Transfer-Encoding together with Content-Length: read as chunked (see the module docstring)
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

    # ---- slow clients ------------------------------------------------------------------------
    def _arm(self, seconds: float, what: str) -> None:
        if seconds <= 0:
            self._deadline = 0.0
            return
        self._deadline = self.loop.time() + seconds
        self._receiving = what
        cls = type(self)
        if cls.sweeper is None:
            cls.sweeper = self.loop.call_later(SWEEP_EVERY, cls._sweep, self.loop, self.connections)

    def _disarm(self) -> None:
        self._deadline = 0.0

    @classmethod
    def _sweep(cls, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        """Times out the listener's connections whose deadline passed; runs again while any has one."""
        now = loop.time()
        pending = False
        for connection in list(connections):
            deadline = getattr(connection, "_deadline", 0.0)
            if not deadline:
                continue
            if now >= deadline:
                connection._timed_out()
            else:
                pending = True
        cls.sweeper = loop.call_later(SWEEP_EVERY, cls._sweep, loop, connections) if pending else None

    def _timed_out(self) -> None:
        """408 for a head or body that did not arrive in time; the connection closes."""
        self._deadline = 0.0
        if self.transport.is_closing():
            return
        cycle: Any = self.cycle
        what = self._receiving
        seconds = self.limits.http_header_timeout if what == "head" else self.limits.http_body_timeout
        flag = "--http-header-timeout" if what == "head" else "--http-body-timeout"
        started = what == "body" and cycle is not None and getattr(cycle, "response_started", False)
        if not started:  # the application has not answered yet: the client learns why
            body = error_body(f"the request {what} did not arrive within {seconds:g} s ({flag})")
            self._write_closing(408, body)
        self.transport.close()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm(self.limits.http_header_timeout, "head")  # a connection that never sends a head

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head = 0
        if not self._deadline:  # a later request on a kept-alive connection: its head starts now
            self._arm(self.limits.http_header_timeout, "head")

    def on_url(self, url: bytes) -> None:
        self._head += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._head > self.max_header_bytes:
            self._too_large = True
            raise _HeadTooLarge  # stops the parser; uvicorn then calls send_400_response
        self._in_head = False
        self._arm(self.limits.http_body_timeout, "body")  # disarmed once the body is complete
        cap = self.limits.http_max_connections
        if cap and len(self.connections) > cap:
            self._asgi_headers_complete(self.overloaded)
            return
        if self.infer_route is not None:
            direct = direct_cycle(self, self.infer_route)
            if direct is not None:
                self.cycle = self.direct = direct  # type: ignore[assignment]
                return
        self._asgi_headers_complete(None)

    def _asgi_headers_complete(self, app: Any) -> None:
        """uvicorn's own head handling: a RequestResponseCycle running ``app`` (None: the server's app)."""
        if app is not None:
            self.app, server_app = app, self.app
        try:
            super().on_headers_complete()
        finally:
            if app is not None:
                self.app = server_app
        cycle: Any = self.cycle  # uvicorn's RequestResponseCycle, or an InferCycle kept there (fast_infer)
        if cycle is None or type(cycle) is InferCycle:
            return
        if app is not None or _chunked_with_length(self.headers):
            cycle.keep_alive = False  # answered, then the connection closes
        # HEAD: uvicorn writes no body at all, so nothing would release a held head
        if cycle.scope["method"] != "HEAD":
            cycle.transport = OneWriteResponses(self.transport)

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle) is InferCycle:
            cycle.chunks.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        cycle: Any = self.cycle
        if type(cycle) is InferCycle:
            cycle.start()
        else:
            super().on_message_complete()
        self._in_head = True  # what arrives next on this connection is the next request's head
        self._raw_head = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        # self.direct, not self.cycle: a pipelined request's cycle may have replaced it there
        if self.direct is not None:
            self.direct.client_gone()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._raw_head += len(data)
        super().data_received(data)
        if self._in_head and self._raw_head > self.max_header_bytes and not self.transport.is_closing():
            self._reject()

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._reject()
        else:
            super().send_400_response(msg)

    def _reject(self) -> None:
        body = error_body(
            f"the request line and headers exceed {self.max_header_bytes} bytes; "
            "send smaller headers or raise --max-header-bytes"
        )
        self._write_closing(431, body)
        self.transport.close()

    def _write_closing(self, status: int, body: bytes) -> None:
        """An error answered before any application saw the request; the connection closes after it."""
        headers = answer_headers(len(body), close=True)
        self.transport.write(head(status, self.server_state.default_headers, headers, body))


def _chunked_with_length(headers: list[tuple[bytes, bytes]]) -> bool:
    """Both Transfer-Encoding and Content-Length (uvicorn has lower-cased the names)."""
    names = {name for name, _ in headers}
    return b"transfer-encoding" in names and b"content-length" in names


def bounded_protocol(limits: Limits, infer_route: InferRoute | None = None) -> type[BoundedHttpToolsProtocol]:
    attributes = {
        "max_header_bytes": limits.max_header_bytes,
        "infer_route": infer_route,
        "limits": limits,
        "overloaded": _Overloaded(limits.http_max_connections),
    }
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), attributes)
