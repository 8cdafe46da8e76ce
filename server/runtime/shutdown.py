"""Graceful shutdown: refuse new requests, let in-flight and queued ones finish within a bound, then unload.

Past the bound, every request still queued or running is answered 503 / UNAVAILABLE instead of being
cut off when the listeners close: the tasks running ``ModelRegistry.infer`` are tracked here and
cancelled into that answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from ..vocabulary.errors import Unavailable
from .model import ModelVersion

log = logging.getLogger(__name__)

T = TypeVar("T")


class GracefulShutdown:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        #: the loop requests run on (``ModelRegistry.loop``), when known: see ``_current_task``
        self._loop = loop
        #: versions whose close did not finish in time (a model stuck in execute): the process must not wait for them
        self.abandoned: list[str] = []
        self.started = False
        #: tasks inside infer(): the shutdown deadline cancels them into a clean 503 / UNAVAILABLE
        self._requests: set[asyncio.Task[Any]] = set()
        self._expired: set[asyncio.Task[Any]] = set()

    async def track(self, call: Awaitable[T]) -> T:
        """Await one request's ``call``, so that the shutdown deadline can answer it UNAVAILABLE."""
        task = self._current_task()
        # the outermost call owns the task's bookkeeping; a nested call (BLS) leaves it to the outer one
        owner = task if task is not None and task not in self._requests else None
        if owner is not None:
            self._requests.add(owner)
        try:
            return await call
        except asyncio.CancelledError:
            if task is None or task not in self._expired:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: this cancellation is handled here
                task.uncancel()
            raise Unavailable(
                "server is shutting down: the request did not finish within the shutdown timeout"
            ) from None
        finally:
            if owner is not None:
                self._requests.discard(owner)

    def _current_task(self) -> asyncio.Task[Any] | None:
        """The running task. Asked of the known loop first: ``asyncio.current_task()`` without a loop looks
        the loop up, and that costs a getpid() system call on Python 3.11 (a syscall per request); another
        loop (or none known) gets the plain lookup."""
        if self._loop is not None:
            task = asyncio.current_task(self._loop)
            if task is not None:
                return task
        return asyncio.current_task()

    async def run(self, everything: list[ModelVersion], background: set[asyncio.Task[Any]], timeout: float) -> None:
        """Drain ``everything`` (the serving versions) and ``background`` (retiring ones) within ``timeout``,
        then close every serving version."""
        self.started = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        drained = await asyncio.gather(*(mv.drain(timeout) for mv in everything))
        if not all(drained):
            # past the bound: what is still queued or running answers 503 / UNAVAILABLE now
            log.warning(
                "shutdown timeout (%.0fs) reached: failing %d unfinished request(s)", timeout, len(self._requests)
            )
            self._expired = set(self._requests)
            for task in self._expired:
                task.cancel()
            await asyncio.gather(*(mv.drain(1.0) for mv in everything))
        if background:
            await asyncio.wait(list(background), timeout=max(0.0, deadline - loop.time()))
        for task in list(background):
            task.cancel()
        for mv in everything:
            try:
                # a batcher's close waits for its queue: give it what is left of the bound, at least 1s
                await asyncio.wait_for(mv.close(), max(1.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                log.warning("%s version %s did not close within the shutdown timeout", mv.name, mv.version)
                self.abandoned.append(f"{mv.name} version {mv.version}")
