"""The one place gRPC turns exceptions into a status code and message (same messages as HTTP)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ..vocabulary.errors import ServerError, internal_error_message

log = logging.getLogger(__name__)

T = TypeVar("T")


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a client sees for ``exc``: the typed error's own code, INTERNAL for a bug."""
    if isinstance(exc, ServerError):
        return getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.UNKNOWN), exc.message
    log.error("unexpected error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, internal_error_message(exc)


def unary(fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Wrap a unary handler so every error leaves as a gRPC status, never as a crash."""

    @functools.wraps(fn)
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await fn(request, context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status below
            code, message = status_of(exc)
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")

    return handler
