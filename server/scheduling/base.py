"""The scheduler interface shared by the default, batching and ensemble schedulers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from ..vocabulary.types import InferenceRequest

if TYPE_CHECKING:
    from .instance_pool import InstancePool


class Scheduler(ABC):
    """Accepts requests for one model version and resolves each with its outputs."""

    async def start(self) -> None:
        """Start background tasks; called on the event loop after the instances loaded."""

    @abstractmethod
    async def submit(self, request: InferenceRequest) -> dict[str, np.ndarray] | None:
        """Execute ``request`` (after queuing/batching) and return its outputs or raise ServerError.

        None: the model answered through ``request.stream`` (decoupled), and returning means its final
        response was sent. Cancelling the awaiting task while the request is queued drops it unexecuted.
        """

    def ready(self) -> bool:
        """Whether the model can serve now beyond being loaded (an ensemble needs its members, a Python
        model its stub processes)."""
        pool = self.instance_pool()
        return pool is None or pool.ready()

    def unready_reason(self) -> str:
        """Why ``ready()`` is False ("" otherwise)."""
        pool = self.instance_pool()
        return pool.unready_reason() if pool is not None else ""

    def instance_pool(self) -> InstancePool | None:
        """The version's instances (None for an ensemble)."""
        return None

    @property
    def pending(self) -> int:
        """Requests waiting in this scheduler's queue (``nv_inference_pending_request_count``)."""
        return 0

    @property
    def holds_state(self) -> bool:
        """Whether unloading now would lose state between requests (live sequences); the model cache
        never evicts such a version."""
        return False

    async def close(self) -> None:
        """Stop background tasks; called once no request is in flight."""
