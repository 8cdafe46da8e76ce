"""The one place gRPC turns exceptions into a status code and message (same messages as HTTP)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from ..vocabulary.errors import InvalidArgument, ServerError, internal_error_message

log = logging.getLogger(__name__)

T = TypeVar("T")


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a client sees for ``exc``: the typed error's own code, INTERNAL for a bug."""
    if isinstance(exc, ServerError):
        return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.UNKNOWN), exc.message
    log.error("unexpected error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, internal_error_message(exc)


class Malformed:
    """What a request that does not parse as its message type becomes (gRPC would answer UNKNOWN)."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.error = InvalidArgument(f"the request is not a valid {type_name} message: {error}")


def deserializer(message_cls: Any) -> Callable[[bytes], Any]:
    """``message_cls.FromString`` that hands a ``Malformed`` to the handler instead of raising."""

    def parse(raw: bytes) -> Any:
        try:
            return message_cls.FromString(raw)
        except DecodeError as exc:
            return Malformed(message_cls.DESCRIPTOR.name, exc)

    return parse


def check_parsed(request: Any) -> None:
    if isinstance(request, Malformed):
        raise request.error


def unary(fn: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Wrap a unary handler so every error leaves as a gRPC status, never as a crash."""

    @functools.wraps(fn)
    async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> T:
        try:
            check_parsed(request)
            return await fn(request, context)
        except Exception as exc:  # mapped to a status below
            code, message = status_of(exc)
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")

    return handler
