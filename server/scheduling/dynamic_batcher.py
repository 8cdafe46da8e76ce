"""Triton's dynamic batcher: turns concurrent requests into batches, on the event loop.

A batch is formed only when an instance is free. While every instance is busy the queue grows, so the
next batch is bigger: that is where the throughput comes from. With a free instance the batcher sends

1. the largest ``preferred_batch_size`` that a prefix of the queue reaches exactly, else
2. everything that fits when the batch cannot grow (``max_batch_size`` rows reached, or the next request
   does not fit or has other non-batch shapes), else
3. everything that fits once the oldest request waited ``max_queue_delay_microseconds`` (at once when 0).

Batches are counted in rows and a request is never split. Requests are taken in service order (priority
level, then arrival; see queue_policy), and the batch is cut before the first request whose input shapes
differ. Results are views into the batch outputs (TensorBackendInstance slices, no copies).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..backends.base import Batch, RequestResult
from ..config import pb
from ..vocabulary.errors import QueueRejected, ServerError, Unavailable
from ..vocabulary.types import InferenceRequest
from .base import Scheduler
from .instance_pool import InstancePool
from .queue_policy import Entry, PriorityQueue, ShapeKey
from .results import answer

log = logging.getLogger(__name__)


def _shape_key(request: InferenceRequest, batching: bool) -> ShapeKey:
    """What requests must share to batch together. The dtype object itself, not ``dtype.str`` (a string
    built on each read, per input of every request)."""
    skip = 1 if batching else 0
    key = [(name, a.dtype, a.shape[skip:]) for name, a in request.inputs.items()]
    key.sort()  # clients may send the same inputs in any order and still share a batch (names are unique)
    return tuple(key)


class DynamicBatcher(Scheduler):
    def __init__(self, pool: InstancePool, config: pb.ModelConfig) -> None:
        db = config.dynamic_batching
        self.pool = pool
        self.max_batch_size = config.max_batch_size
        self.batching = config.max_batch_size > 0
        # a model without a batch dimension still queues, but executes one request at a time
        self.max_rows = config.max_batch_size if self.batching else 1
        self.delay_ns = db.max_queue_delay_microseconds * 1000
        self.preferred = sorted({p for p in db.preferred_batch_size if p <= self.max_rows}, reverse=True)
        self.preserve_ordering = db.preserve_ordering
        self.queue = PriorityQueue(db)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._event_loop: asyncio.AbstractEventLoop  # set by start()
        self._timer: asyncio.TimerHandle | None = None
        self._running = 0
        self._closing = False
        self._idle: asyncio.Event | None = None
        # preserve_ordering: results wait in _done until every earlier arrival was delivered
        self._next_seq = 0
        self._deliver_seq = 0
        self._done: dict[int, tuple[Entry, RequestResult | None]] = {}

    # ---- Scheduler interface ----------------------------------------------------------------
    def instance_pool(self) -> InstancePool:
        return self.pool

    @property
    def pending(self) -> int:
        return len(self.queue)

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # kept: asyncio.get_running_loop() costs a getpid() system call on Python 3.11 (its fork check), and
        # the request path asked for it twice per request (a visible share of the loop's busy time in py-spy)
        self._event_loop = asyncio.get_running_loop()
        self._task = self._event_loop.create_task(self._loop(), name=f"batcher-{id(self):x}")

    async def submit(self, request: InferenceRequest) -> dict[str, np.ndarray] | None:
        if self._closing or self._wake is None:
            raise Unavailable(f"model '{request.model_name}' is unloading")
        level = self.queue.level_of(request)
        now = time.monotonic_ns()
        request.queued_ns = now
        future: asyncio.Future[dict[str, np.ndarray] | None] = self._event_loop.create_future()
        entry = Entry(request, future, request.batch_size(self.max_batch_size), _shape_key(request, self.batching), now)
        self.queue.push(entry, level)  # raises QueueRejected when the level is full
        if self.preserve_ordering:
            entry.seq = self._next_seq
            self._next_seq += 1
        self._idle.clear()  # type: ignore[union-attr]
        self._wake.set()
        return await future

    async def close(self) -> None:
        """Stop once every queued request was executed and delivered."""
        self._closing = True
        if self._task is None:
            return
        assert self._idle is not None and self._wake is not None
        self._wake.set()
        await self._idle.wait()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        if self._timer is not None:
            self._timer.cancel()

    # ---- the batching loop --------------------------------------------------------------------
    async def _loop(self) -> None:
        assert self._wake is not None and self._idle is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            # one more loop turn: requests whose bytes arrived in the same poll join this batch
            await asyncio.sleep(0)
            self._wake.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            now = time.monotonic_ns()
            for entry in self.queue.expire(now):
                self._finish(
                    entry,
                    QueueRejected(
                        f"Request timeout expired: request waited more than its queue timeout in model "
                        f"'{entry.request.model_name}'"
                    ),
                )
            wake_at = await self._dispatch(now)
            deadline = self.queue.next_deadline_ns
            if deadline and (not wake_at or deadline < wake_at):
                wake_at = deadline
            if wake_at:
                self._timer = loop.call_later(max(wake_at - time.monotonic_ns(), 0) / 1e9, self._wake.set)
            if not self.queue and not self._running:
                self._idle.set()

    async def _dispatch(self, now: int) -> int:
        """Send batches while an instance is free; returns when to look again (ns), 0 = on the next event."""
        while self.queue and self.pool.has_free():
            take, reason_wait = self._choose(now)
            if take == 0:
                if reason_wait:
                    return reason_wait
                continue  # cancelled requests were dropped: look again
            entries = self.queue.pop(take)
            slot = self.pool.take_free()
            self._running += 1
            if self.pool.runs_inline:
                # a short execution on this thread anyway: run it here rather than in a task of its own
                # (a task and two loop turns less per batch)
                await self._execute_here(slot, entries)
            else:
                self._event_loop.create_task(self._execute(slot, entries))
        return 0

    async def _execute_here(self, slot: int, entries: list[Entry]) -> None:
        """``_execute`` inside the batching loop, which must outlive whatever a batch raises."""
        try:
            await self._execute(slot, entries)
        except Exception:  # the batch's requests have their answer; _execute re-raised for the task's log
            log.exception("model '%s': a batch failed", entries[0].request.model_name)

    def _choose(self, now: int) -> tuple[int, int]:
        """(number of queued entries to send now, 0) or (0, ns to wait until the oldest request's delay)."""
        rows = 0
        count = 0
        key = None
        saturated = False
        reachable: dict[int, int] = {}  # prefix rows → entries
        for entry in self.queue:
            if entry.future.done():  # the client went away: drop it instead of computing for nobody
                self._drop_cancelled()
                return 0, 0
            if key is None:
                key = entry.key
            elif entry.key != key or rows + entry.rows > self.max_rows:
                saturated = True
                break
            rows += entry.rows
            count += 1
            reachable[rows] = count
            if rows >= self.max_rows:
                saturated = True
                break
        for size in self.preferred:
            if size in reachable:
                return reachable[size], 0
        if saturated or self.delay_ns == 0:
            return count, 0
        due = self.queue.oldest_ns() + self.delay_ns
        if now >= due:
            return count, 0
        return 0, due

    def _drop_cancelled(self) -> None:
        for entry in self.queue.remove_done():
            self._finish(entry, None)

    async def _execute(self, slot: int, entries: list[Entry]) -> None:
        batch = Batch([e.request for e in entries], self.max_batch_size, rows=[e.rows for e in entries])
        try:
            results = await self.pool.execute(slot, batch)
        except BaseException as exc:  # cancelled while closing: fail the batch rather than hang its clients
            results = [exc if isinstance(exc, Exception) else Unavailable("model is unloading")] * len(entries)
            raise
        finally:
            self.pool.release(slot)
            self._running -= 1
            self._wake.set()  # type: ignore[union-attr]
            multi = len(entries) > 1
            in_order = not self.preserve_ordering
            for entry, result in zip(entries, results, strict=True):
                if isinstance(result, dict):
                    if multi and entry.request.requested_outputs is not None:
                        wanted = entry.request.requested_outputs
                        result = {n: a for n, a in result.items() if n in wanted}
                    if in_order:  # the common case, what _finish would do, without its bookkeeping
                        if not entry.future.done():
                            entry.future.set_result(result)
                        continue
                elif isinstance(result, Future):  # answered later (a Python model's response sender)
                    self._finish_later(entry, result)
                    continue
                self._finish(entry, _Streamed.of(result))

    def _finish_later(self, entry: Entry, pending: Future[Any]) -> None:
        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled():
                self._finish(entry, Unavailable("model is unloading"))
            else:
                exc = f.exception()
                self._finish(entry, exc if isinstance(exc, Exception) else _Streamed.of(f.result()))

        asyncio.wrap_future(pending).add_done_callback(done)

    def _finish(self, entry: Entry, result: RequestResult | ServerError | None) -> None:
        """Resolve ``entry`` now, or (preserve_ordering) once every earlier arrival is resolved."""
        if not self.preserve_ordering:
            _resolve(entry, result)
            return
        self._done[entry.seq] = (entry, result)
        while self._deliver_seq in self._done:
            e, r = self._done.pop(self._deliver_seq)
            self._deliver_seq += 1
            _resolve(e, r)


class _Streamed:
    """A result of None means "answered through the request's stream"; ``_finish`` uses None for "drop"."""

    @staticmethod
    def of(result: Any) -> Any:
        return _STREAMED if result is None else result


_STREAMED = _Streamed()


def _resolve(entry: Entry, result: RequestResult | ServerError | _Streamed | None) -> None:
    if entry.future.done() or result is None:
        return
    if result is _STREAMED:
        entry.future.set_result(None)
        return
    assert isinstance(result, (dict, Exception))
    answer(entry.future, result)
