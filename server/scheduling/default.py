"""Request-by-request execution for models without dynamic batching."""

from __future__ import annotations

import time

import numpy as np

from ..backends.base import Batch
from ..vocabulary.types import InferenceRequest
from .base import Scheduler
from .instance_pool import InstancePool
from .results import unwrap


class DefaultScheduler(Scheduler):
    def __init__(self, pool: InstancePool, max_batch_size: int) -> None:
        self.pool = pool
        self.max_batch_size = max_batch_size
        self._waiting = 0

    @property
    def pending(self) -> int:
        return self._waiting

    async def submit(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        request.queued_ns = time.monotonic_ns()
        self._waiting += 1
        try:
            slot = await self.pool.acquire()
        finally:
            self._waiting -= 1
        try:
            batch = Batch([request], self.max_batch_size)
            (result,) = await self.pool.execute(slot, batch)
        finally:
            self.pool.release(slot)
        return unwrap(result)
