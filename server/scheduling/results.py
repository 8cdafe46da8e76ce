"""Turns a backend's per-request result into outputs or a client-facing error."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..backends.base import RequestResult
from ..vocabulary.errors import BackendError, ServerError


def unwrap(result: RequestResult) -> dict[str, np.ndarray] | None:
    """Outputs, or None when the responses went to the request's stream; raises the request's error."""
    if result is None:
        return None
    if isinstance(result, ServerError):
        raise result
    if isinstance(result, Exception):
        raise BackendError(f"model execution failed: {type(result).__name__}: {result}") from result
    assert not isinstance(result, Future), "settle() pending results"
    return result


async def settle(result: RequestResult) -> dict[str, np.ndarray] | None:
    """``unwrap`` after waiting for a result the backend delivers later."""
    if isinstance(result, Future):
        result = await asyncio.wrap_future(result)
    return unwrap(result)


def answer(future: asyncio.Future[Any], result: RequestResult | ServerError) -> None:
    """Give a queued request its outputs, or its client-facing error, unless it was answered already
    (cancelled, timed out); how the dynamic and the sequence batcher hand back each request's share."""
    if future.done():
        return
    if isinstance(result, Exception):
        try:
            unwrap(result)
        except ServerError as err:
            future.set_exception(err)
        return
    future.set_result(result)
