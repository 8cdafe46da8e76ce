"""The sequence extension's request parameters: ``sequence_id``, ``sequence_start``, ``sequence_end``.

Triton (docs/protocol/extension_sequence.md): ``sequence_id`` is a uint64 or a string; 0 and "" mean
"not part of a sequence"; the start and end flags need a non-zero / non-empty id. Both front ends pass
request parameters through unchanged (HTTP JSON numbers and strings, gRPC ``int64_param`` /
``uint64_param`` / ``string_param`` and ``bool_param``), so this is the one place they are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument

SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"
#: Triton's TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END (the Python backend's ``request.flags()``)
FLAG_START = 1
FLAG_END = 2
UINT64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Sequence:
    """A request's place in a sequence; ``correlation_id`` 0 or "" = none."""

    correlation_id: int | str = 0
    start: bool = False
    end: bool = False

    @property
    def flags(self) -> int:
        return (FLAG_START if self.start else 0) | (FLAG_END if self.end else 0)

    def __bool__(self) -> bool:
        return self.correlation_id not in (0, "")


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"Unable to parse '{key}': expected a boolean, got {value!r}")
    return value


def sequence_of(params: dict[str, Any]) -> Sequence:
    """The sequence parameters of a request (its ``parameters`` dict); raises InvalidArgument on bad types."""
    cid = params.get(SEQUENCE_ID, 0)
    if isinstance(cid, bool) or not isinstance(cid, (int, str)):
        raise InvalidArgument(f"Unable to parse '{SEQUENCE_ID}': expected an unsigned integer or a string, got {cid!r}")
    if isinstance(cid, int) and not 0 <= cid <= UINT64_MAX:
        raise InvalidArgument(f"Unable to parse '{SEQUENCE_ID}': {cid} is not an unsigned 64-bit integer")
    return Sequence(cid, _flag(params, SEQUENCE_START), _flag(params, SEQUENCE_END))


def sequence_parameters(correlation_id: int | str, flags: int) -> dict[str, Any]:
    """Request parameters for a sequence step (BLS calls from Python models carry them this way)."""
    if correlation_id in (0, ""):
        return {}
    return {
        SEQUENCE_ID: correlation_id,
        SEQUENCE_START: bool(flags & FLAG_START),
        SEQUENCE_END: bool(flags & FLAG_END),
    }
