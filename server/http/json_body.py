"""The one parser of JSON request bodies on the HTTP front end, with Triton's parse-error text.

Triton parses every JSON body with rapidjson and answers a body it cannot parse with HTTP 400 and
``failed to parse the request JSON buffer: <rapidjson's message> at <offset>`` (its qa tests match that
text, e.g. ``Invalid value. at 0``). orjson parses here (it is several times faster), and only on a
failure is the body looked at again to name the error as rapidjson would. A body of zero bytes is
Triton's "no body" (its handlers then use the defaults); a body of whitespace only is not: rapidjson
calls it an empty document.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ..vocabulary.errors import InvalidArgument

PREFIX = "failed to parse the request JSON buffer: "
EMPTY = "The document is empty."
INVALID = "Invalid value."
TRAILING = "The document root must not be followed by other values."
#: Python's json messages (which name the error's kind, unlike orjson's) → rapidjson's wording
_RAPIDJSON = {
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid \\escape": "Invalid escape character in string.",
    "Invalid \\uXXXX escape": "Incorrect hex digit after \\u escape in string.",
    "Invalid control character at": "Invalid encoding in string.",
    "Extra data": TRAILING,
}


def _innermost_open(text: str, end: int) -> str:
    """``{`` or ``[``: the container still open at ``end`` (strings skipped), or '' at the top level."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:end]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def parse_error(body: bytes) -> str:
    """Triton's message for a body that does not parse (called on the error path only)."""
    stripped = body.lstrip(b" \t\r\n")
    if not stripped:
        return f"{PREFIX}{EMPTY} at {len(body)}"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{PREFIX}Invalid encoding in string. at {exc.start}"
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Expecting ',' delimiter":
            kind = _innermost_open(text, exc.pos)
            message = (
                "Missing a comma or '}' after an object member."
                if kind == "{"
                else "Missing a comma or ']' after an array element."
            )
        else:
            message = _RAPIDJSON.get(exc.msg, INVALID)
        return f"{PREFIX}{message} at {exc.pos}"
    # Python's parser took it (NaN, Infinity) where orjson and rapidjson do not
    return f"{PREFIX}{INVALID} at {len(body) - len(stripped)}"


def parse(body: bytes) -> Any:
    """The JSON value of ``body``; InvalidArgument with Triton's text when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidArgument(parse_error(body)) from None


def parse_object(body: bytes, what: str = "the request body") -> dict[str, Any]:
    """A JSON object body; zero bytes is an empty object (no body: every field takes its default)."""
    if not body:
        return {}
    data = parse(body)
    if not isinstance(data, dict):
        raise InvalidArgument(f"{what} must be a JSON object")
    return data
