"""Request and output parameters (KServe v2 ``parameters``) that the server itself interprets.

HTTP (JSON values) and gRPC (``InferParameter`` oneofs) decode to the same plain values first; the
checks here then give both protocols the same answer for the same mistake.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument


def int_parameter(params: dict[str, Any], key: str, where: str) -> int | None:
    """A request/output parameter that must be a non-negative integer (priority, timeout, classification,
    binary_data_size); None when absent."""
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{where}: parameter '{key}' must be a non-negative integer, got {value!r}")
    return value
