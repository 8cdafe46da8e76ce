"""The head of an inference answer, decided once for both ways in.

The direct path (``fast_infer``) writes its answers' bytes itself and the ASGI route (``infer_route``) hands
header pairs to uvicorn, which writes its default headers (date, server) first and, on a connection that
will close, a ``connection: close`` last. ``answer_headers`` says which headers an answer carries and in which
order; ``head`` writes them as uvicorn would, so the two ways in answer byte for byte alike (a test holds
them to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

Header = tuple[bytes, bytes]

JSON = (b"content-type", b"application/json")
BINARY = (b"content-type", b"application/octet-stream")
CLOSE = (b"connection", b"close")


def answer_headers(
    length: int, json_length: int | None = None, close: bool = False, extra: Sequence[Header] = ()
) -> list[Header]:
    """The headers of an answer of ``length`` bytes: JSON, or (``json_length`` given) a JSON header of that
    many bytes followed by binary tensors; ``extra`` (e.g. ``www-authenticate``); ``connection: close`` last
    when the connection closes after it."""
    if json_length is None:
        headers = [(b"content-length", b"%d" % length), JSON]
    else:
        headers = [
            (b"content-length", b"%d" % length),
            BINARY,
            (b"inference-header-content-length", b"%d" % json_length),
        ]
    if extra:
        headers += extra
    if close:
        headers.append(CLOSE)
    return headers


def head(status: int, defaults: Iterable[Header], headers: Iterable[Header], body: bytes = b"") -> bytes:
    """The status line and headers as uvicorn writes them, ``defaults`` (the server's date, server) first;
    then ``body``, if given, in the same join (a response that leaves in one write copies its payload once)."""
    parts = [STATUS_LINE[status]]
    for name, value in defaults:
        parts += (name, b": ", value, b"\r\n")
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)
