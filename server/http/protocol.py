"""A bound on the size of an HTTP request's head (request line and headers).

uvicorn's httptools protocol accepts headers of any size (a 10 MB header was answered 200 here), and
httptools has no setting for it, so this subclass answers 431 when a head passes ``--max-header-bytes``,
before the request reaches the application. Two counts: the parsed URL and headers (exact, checked
when the head is complete), and the raw bytes received while a head is still incomplete (so a head
that never ends cannot grow without bound; this one may let one socket read past the limit).
uvicorn's h11 protocol, used when httptools is missing, has ``h11_max_incomplete_event_size`` for
the same purpose; ``app`` sets both.
"""

from __future__ import annotations

import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .codec import error_body


class _HeadTooLarge(Exception):
    pass


#: measured: see OneWriteResponses (KUBEINFER_HTTP_COALESCE=0 turns it off)
COALESCE = os.environ.get("KUBEINFER_HTTP_COALESCE", "1") == "1"


class OneWriteResponses:
    """The transport as one response cycle sees it: the head of a response with a Content-Length waits for
    its body, so the response leaves in one ``write()``.

    uvicorn writes the status line and headers at ``http.response.start`` and the body at
    ``http.response.body``: two system calls per response. On add_sub at concurrency 16 py-spy put 26%
    of the event loop's busy time in those ``write`` calls. Chunked responses (streams) are written as
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


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 16 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._raw_head = 0  # bytes received since the head began
        self._head = 0  # URL and header bytes parsed
        self._too_large = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head = 0

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
        super().on_headers_complete()
        # HEAD: uvicorn writes no body at all, so nothing would release a held head
        if self.cycle is not None and COALESCE and self.cycle.scope["method"] != "HEAD":
            self.cycle.transport = OneWriteResponses(self.transport)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what arrives next on this connection is the next request's head
        self._raw_head = 0

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
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()


def bounded_protocol(max_header_bytes: int) -> type[BoundedHttpToolsProtocol]:
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"max_header_bytes": max_header_bytes})
