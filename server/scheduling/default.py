"""Request-by-request execution for models without dynamic batching."""

from __future__ import annotations

import time
from concurrent.futures import Future

import numpy as np

from ..backends.base import Batch, RequestResult
from ..vocabulary.errors import Cancelled
from ..vocabulary.types import InferenceRequest
from .base import Scheduler
from .instance_pool import InstancePool
from .results import settle, unwrap


class DefaultScheduler(Scheduler):
    def __init__(self, pool: InstancePool, max_batch_size: int) -> None:
        self.pool = pool
        self.max_batch_size = max_batch_size
        self._waiting = 0

    def instance_pool(self) -> InstancePool:
        return self.pool

    @property
    def pending(self) -> int:
        return self._waiting + self.pool.waiting

    async def submit(self, request: InferenceRequest) -> dict[str, np.ndarray] | None:
        request.queued_ns = time.monotonic_ns()
        if self.pool.direct:  # instances in other processes: the pool starts the batch from its callbacks
            (result,) = await self.pool.submit(Batch([request], self.max_batch_size))
        else:
            result = await self._run(request)
        if isinstance(result, Future):  # answered later (a Python model's response sender)
            return await settle(result)
        return unwrap(result)

    async def _run(self, request: InferenceRequest) -> RequestResult:
        self._waiting += 1
        try:
            slot = await self.pool.acquire()
        finally:
            self._waiting -= 1
        try:
            if request.cancelled:  # the client went away while it waited: never execute it
                raise Cancelled("Request was cancelled")
            batch = Batch([request], self.max_batch_size)
            (result,) = await self.pool.execute(slot, batch)
        finally:
            self.pool.release(slot)
        return result
