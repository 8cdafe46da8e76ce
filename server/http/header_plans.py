"""Decoded JSON headers of plain binary requests, kept so that a header sent again is not parsed again.

A client calling a model in a loop sends the same header bytes with every call (``tritonclient``
builds it from the input names, datatypes and shapes alone). When every input of such a header is a
plain binary tensor (parameters exactly ``{"binary_data_size": n}``) and it carries no ``id`` and no
request ``parameters``, everything ``decode_request`` derives from it depends on those bytes and the
server's limits only; every call still checks the body's length against the header's binary sizes
and views its own tensors. What it saves on the binary add_sub request: README 'Performance against
Triton and MLServer'.

Requests with an id or parameters (sequence ids change on every call), shared memory (the regions can
change between calls) or BYTES inputs (their elements are in the body) are never kept: they would only
churn the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..vocabulary.limits import Limits
from ..vocabulary.types import InferenceRequest

#: distinct headers kept (the oldest is dropped first); each is at most MAX_HEADER_BYTES long
CAPACITY = 256
MAX_HEADER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class HeaderPlan:
    """What one header decodes to, short of the tensors themselves."""

    limits: Limits
    #: per input: name, shape, wire dtype, bytes in the body (in body order)
    inputs: tuple[tuple[str, tuple[int, ...], np.dtype, int], ...]
    binary_size: int
    requested: tuple[str, ...] | None
    #: per output wire options, as decode_request returns them (read only)
    options: dict[str, Any]

    def request(
        self, body: bytes, json_len: int, model_name: str, model_version: str
    ) -> tuple[InferenceRequest, dict[str, Any]]:
        """The request for ``body`` (its length already matched to ``binary_size``)."""
        inputs = {}
        offset = json_len
        for name, shape, dtype, size in self.inputs:
            inputs[name] = np.ndarray(shape, dtype, body, offset)
            offset += size
        request = InferenceRequest(
            model_name=model_name,
            model_version=model_version,
            inputs=inputs,
            requested_outputs=None if self.requested is None else list(self.requested),
        )
        return request, dict(self.options)


K = TypeVar("K")
V = TypeVar("V")


class Kept(dict[K, V]):
    """At most ``capacity`` entries, the oldest dropped first: what a key decodes or encodes to, kept so that
    a key seen again is not worked out again. Its length and keys are public: they say what was kept."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def keep(self, key: K, value: V) -> None:
        if len(self) >= self.capacity:
            self.pop(next(iter(self)), None)
        self[key] = value


#: the plans kept, by header bytes
PLANS: Kept[bytes, HeaderPlan] = Kept(CAPACITY)


def lookup(head: bytes, body_len: int, limits: Limits) -> HeaderPlan | None:
    """The plan of ``head`` when it was decoded before under ``limits`` and the body has its binary size."""
    plan = PLANS.get(head)
    if plan is None or plan.limits is not limits or body_len - len(head) != plan.binary_size:
        return None
    return plan


def remember(
    head: bytes, header: dict[str, Any], request: InferenceRequest, options: dict[str, Any], limits: Limits
) -> None:
    """Keeps the plan of a header that ``decode_request`` just decoded into ``request``, if it qualifies."""
    if len(head) > MAX_HEADER_BYTES or request.id or request.parameters:
        return
    inputs = []
    for item in header["inputs"]:
        params = item.get("parameters")
        if not isinstance(params, dict) or len(params) != 1 or "binary_data_size" not in params:
            return  # JSON data or shared memory: not decided by the header alone
        array = request.inputs[item["name"]]
        if array.dtype.kind == "O":
            return  # BYTES: the elements are read from the body
        inputs.append((item["name"], tuple(item["shape"]), array.dtype, params["binary_data_size"]))
    if any(opt["shm"] is not None for key, opt in options.items() if key != "__default_binary__"):
        return
    requested = None if request.requested_outputs is None else tuple(request.requested_outputs)
    plan = HeaderPlan(limits, tuple(inputs), sum(i[3] for i in inputs), requested, dict(options))
    PLANS.keep(head, plan)
