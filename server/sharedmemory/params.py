"""The shared-memory tensor parameters, as both front ends receive them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..vocabulary.errors import InvalidArgument

SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_PARAMS = (SHM_REGION, SHM_OFFSET, SHM_BYTE_SIZE)


@dataclass(frozen=True)
class ShmRef:
    """Where one tensor lives: ``byte_size`` bytes at ``offset`` into registered region ``region``."""

    region: str
    offset: int
    byte_size: int


def _int(params: Mapping[str, Any], key: str, where: str) -> int:
    value = params[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(f"{where}: Unable to parse '{key}': expected a non-negative integer, got {value!r}")
    return value


def shm_ref(params: Mapping[str, Any], where: str) -> ShmRef | None:
    """The tensor's region reference, or None when it carries no shared-memory parameter.

    Triton: ``shared_memory_offset`` is optional (default 0); ``shared_memory_region`` and
    ``shared_memory_byte_size`` are required together — "If only one of the two is given Triton
    will return an error" (docs/protocol/extension_shared_memory.md).
    """
    if SHM_REGION not in params and SHM_BYTE_SIZE not in params and SHM_OFFSET not in params:
        return None  # the common case, tested without a generator (once per tensor)
    has_region, has_size = SHM_REGION in params, SHM_BYTE_SIZE in params
    if not (has_region and has_size):
        missing = SHM_BYTE_SIZE if has_region else SHM_REGION
        raise InvalidArgument(
            f"{where}: '{missing}' must be given with '{SHM_REGION if has_size else SHM_BYTE_SIZE}' "
            "for a tensor in shared memory"
        )
    region = params[SHM_REGION]
    if not isinstance(region, str) or not region:
        raise InvalidArgument(f"{where}: Unable to parse '{SHM_REGION}': expected a region name, got {region!r}")
    offset = _int(params, SHM_OFFSET, where) if SHM_OFFSET in params else 0
    return ShmRef(region, offset, _int(params, SHM_BYTE_SIZE, where))
