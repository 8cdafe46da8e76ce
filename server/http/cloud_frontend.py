"""What the SageMaker and Vertex AI listeners share: thin ASGI front ends over the HTTP front end.

Triton builds both (``src/sagemaker_server.cc``, ``src/vertex_ai_server.cc``) as subclasses of its HTTP
server that route their own paths to the same handlers. Here the same: inference goes through
``InferRoute.answer`` (the one function that decodes a v2 request, runs it and encodes the answer), every
other route is the HTTP front end itself, called with the path (and method) Triton's handler would use.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..vocabulary.errors import InvalidArgument, ServerError
from .codec import error_body
from .infer_route import InferRoute, Receive, Scope, Send, _DisconnectWatch, _read_body
from .response_head import Header


def header_length_from_mime(content_type: str | None, mime: str, body_length: int) -> str | None:
    """Triton's ``GetInferenceHeaderLength`` of both listeners: the JSON header's length from
    ``Content-Type: <mime><N>`` (``None``: the whole body is JSON; ``"0"``: the body is one raw input)."""
    if content_type is None:
        return None
    pos = content_type.find(mime)
    if pos < 0:
        return None
    if pos != 0:
        raise InvalidArgument(f"expect MIME type for binary data starts with '{mime}', got: {content_type}")
    rest = content_type[len(mime) :]
    value = _atoi(rest)
    if value < 0 or value > body_length:
        raise InvalidArgument(f"inference header size should be in range (0, {body_length}), got: {rest}")
    return str(value)


def _atoi(text: str) -> int:
    """C's ``atoi``: leading blanks, a sign, the digits that follow; 0 when there are none."""
    text = text.lstrip(" \t\n\r\f\v")
    sign = -1 if text[:1] == "-" else 1
    if text[:1] in "+-":
        text = text[1:]
    digits = ""
    for ch in text:
        if not ch.isdigit():
            break
        digits += ch
    return sign * int(digits) if digits else 0


def header(scope: Scope, name: bytes) -> str | None:
    value = next((v for k, v in scope["headers"] if k == name), None)
    return None if value is None else value.decode("latin-1")


def rewritten(scope: Scope, path: str, method: str | None = None) -> Scope:
    """``scope`` as if the request had asked for ``path`` (with ``method``): what the HTTP front end serves."""
    out = dict(scope)
    out["path"] = path
    out["raw_path"] = path.encode()
    out["query_string"] = b""
    if method is not None:
        out["method"] = method
    return out


async def respond(send: Send, status: int, payload: bytes = b"", headers: Sequence[Header] = ()) -> None:
    head: list[Header] = [(b"content-length", b"%d" % len(payload)), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


async def authorized(route: InferRoute, scope: Scope, send: Send) -> bool:
    """The HTTP front end's ``--auth-token-file`` check, for the requests these listeners serve themselves."""
    if route.token is None:
        return True
    if route.token.accepts(next((v for k, v in scope["headers"] if k == b"authorization"), None)):
        return True
    await respond(
        send,
        401,
        error_body("this server requires 'Authorization: Bearer <token>' (see --auth-token-file)"),
        [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
    )
    return False


async def infer(
    route: InferRoute, scope: Scope, receive: Receive, name: str, version: str, mime: str
) -> tuple[int, bytes, int | None] | None:
    """One inference request whose JSON header length comes from ``Content-Type: <mime><N>``; request bodies
    are taken as they come (Triton: identity compression on these listeners). None: the client went away."""
    try:
        body = await _read_body(receive, route.max_body)
        header_length = header_length_from_mime(header(scope, b"content-type"), mime, len(body))
    except ConnectionAbortedError:
        return None
    except ServerError as exc:
        return exc.http_status, error_body(exc.message), None
    return await route.answer(name, version, header_length, body, lambda request: _DisconnectWatch(request, receive))


def json_headers() -> list[Header]:
    return [(b"content-type", b"application/json")]
