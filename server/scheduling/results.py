"""Turns a backend's per-request result into outputs or a client-facing error."""

from __future__ import annotations

import numpy as np

from ..backends.base import RequestResult
from ..vocabulary.errors import BackendError, ServerError


def unwrap(result: RequestResult) -> dict[str, np.ndarray]:
    if isinstance(result, ServerError):
        raise result
    if isinstance(result, Exception):
        raise BackendError(f"model execution failed: {type(result).__name__}: {result}") from result
    return result
