"""Inference request bodies sent compressed (``Content-Encoding``), as Triton reads them.

tritonclient's HTTP client compresses the request body with ``request_compression_algorithm="gzip"`` or
``"deflate"`` (zlib format). Triton (src/http_server.cc, ``GetRequestCompressionType`` and
``DataCompressor::DecompressData``) inflates ``gzip`` and ``deflate`` with zlib's header detection, takes
``identity`` or no header as is, and answers any other coding 415 with ``Accept-Encoding: gzip, deflate``;
``Inference-Header-Content-Length`` counts the decompressed body. So does this, with two additions: the
decompressed size is held to ``--http-max-input-size`` while inflating (a small gzip bomb cannot grow into
gigabytes), and a corrupt or cut-off stream is a 400 saying so (Triton parses what zlib gave up to the
error). Responses are not compressed (``Accept-Encoding`` is not honoured: identity is always acceptable).
"""

from __future__ import annotations

import zlib

from ..vocabulary.errors import InvalidArgument
from ..vocabulary.limits import body_too_large

#: what a 415 tells the client to use instead (Triton's header value)
ACCEPTED = b"gzip, deflate"
#: bodies up to this many bytes are inflated on the event loop; larger ones in a thread
INLINE_BELOW = 256 * 1024


class UnsupportedEncoding(Exception):
    """A ``Content-Encoding`` this server cannot decode: 415."""

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"unsupported Content-Encoding '{encoding}': this server reads gzip, deflate or identity request bodies"
        )


def decode_body(body: bytes, encoding: bytes, limit: int) -> bytes:
    """``body`` as sent before its ``Content-Encoding`` (``encoding``) was applied, at most ``limit`` bytes."""
    coding = encoding.strip().lower()
    if coding in (b"", b"identity"):
        return body
    name = coding.decode("latin-1")
    if coding not in (b"gzip", b"deflate"):
        raise UnsupportedEncoding(encoding.decode("latin-1"))
    if not body:
        raise InvalidArgument("nothing to be decompressed")  # Triton's text
    inflater = zlib.decompressobj(15 | 32)  # a gzip or a zlib header, detected (Triton's inflateInit2(15 | 32))
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"the request body is not valid {name} data (Content-Encoding: {name}): {exc}") from None
    if len(data) > limit:
        raise body_too_large(f"more than {limit} decompressed", limit)
    if not inflater.eof:
        raise InvalidArgument(f"the request body's {name} stream is cut off (Content-Encoding: {name})")
    return data
