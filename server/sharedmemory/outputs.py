"""What both front ends check in a requested output's parameters: classification and shared memory."""

from __future__ import annotations

from typing import Any

from ..vocabulary.errors import InvalidArgument, Unsupported
from ..vocabulary.parameters import int_parameter
from .params import ShmRef, shm_ref
from .registry import DISABLED, SharedMemoryRegistry


def require(shm: SharedMemoryRegistry | None) -> SharedMemoryRegistry:
    """``shm``, or the refusal (UNSUPPORTED) for a server started without client shared memory."""
    if shm is None:
        raise Unsupported(DISABLED)
    return shm


def output_options(params: dict[str, Any], name: str, shm: SharedMemoryRegistry | None) -> tuple[int, ShmRef | None]:
    """The output's ``classification`` count (0: none) and shared-memory region, with Triton's refusals:
    a negative or non-integer count, incomplete region parameters, both at once, an unknown region."""
    where = f"output '{name}'"
    classification = int_parameter(params, "classification", where) or 0
    ref = shm_ref(params, where)
    if ref is not None:
        if classification:
            raise InvalidArgument(f"{where}: shared memory can't be set on classification output")
        require(shm).check_output(ref)
    return classification, ref
