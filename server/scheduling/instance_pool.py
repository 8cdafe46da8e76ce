"""Execution slots of one model version: each instance on its own thread, batches to the first free one.

One hand-off per batch: the event loop passes a batch to an instance's single-thread executor and
awaits the result. ONNX Runtime and TensorRT release the GIL, so instances run in parallel.

Except for short executions: a hand-off costs two thread wake-ups (the executor's, then the loop's),
which on a busy 2-core machine is more than running a small model. When an instance allows it
(``may_run_on_loop``) and its recent executions averaged under ``INLINE_BELOW_NS``, the batch runs on
the loop's thread; each inline run keeps the average current, so a model that gets slower (bigger
batches) goes back to its thread: add_sub's executions run inline (README 'Performance against Triton and
MLServer' counts it among what cut HTTP's CPU). ResNet-18's executions take milliseconds: they stay on
their thread.

Instances whose work happens in another process (a Python model's stub) offer ``start(batch, done)``
instead: no thread at all. ``submit`` hands such a pool's batch to the first free instance, and the
callback that reads an instance's answer starts the next waiting batch on it right there: the instance
idles for one round trip between batches, not for the several loop turns in which a waiting coroutine
would be woken to send it (docs/backends/python.md measures it).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from ..backends.base import BackendInstance, Batch, RequestResult
from ..vocabulary.errors import Cancelled
from ..vocabulary.types import ExecutionTimings

if TYPE_CHECKING:
    from .rate_limiter import RateLimiter, Ticket

#: executions averaging less than this (CPU ns of the executing thread, moving average) run on the event
#: loop's thread: below it, a thread hand-off's wake-ups cost more than the execution blocks the loop
#: (docs/performance.md measures both)
INLINE_BELOW_NS = 200_000
#: executions on the instance's thread before the average is trusted
LEARN_EXECUTIONS = 8
#: seconds a slot granted its rate-limiter resources may stay untaken before they go back (when no batch
#: waits for it any more)
UNUSED_GRANT_S = 0.005


def _cpu_timed(instance: BackendInstance, batch: Batch) -> tuple[list[RequestResult], int]:
    """``instance.execute(batch)`` and the CPU time it took on this thread: unlike wall time, it does not
    grow while the thread waits for a core on a busy machine."""
    t0 = time.thread_time_ns()
    results = instance.execute(batch)
    return results, time.thread_time_ns() - t0


def _executed_rows(batch: Batch, results: list[RequestResult]) -> int:
    """Rows to count as inferences: Triton counts successful ones only, so rows of requests that failed
    are left out (a request answered later, through a response sender, counts as executed)."""
    if len(results) == len(batch.rows) and not batch.fillers and not any(isinstance(r, Exception) for r in results):
        return sum(batch.rows)
    return sum(
        rows
        for i, (rows, res) in enumerate(zip(batch.rows, results, strict=True))
        if not isinstance(res, Exception) and i not in batch.fillers
    )


def _resolver(future: asyncio.Future[list[RequestResult]]) -> Callable[[list[RequestResult]], None]:
    def done(results: list[RequestResult]) -> None:
        if not future.done():
            future.set_result(results)

    return done


class ExecutionRecorder(Protocol):
    """Where executions are counted (the runtime passes the version's ``observability.stats.ModelStats``)."""

    def record_execution(self, batch_size: int, timings: ExecutionTimings) -> None: ...


class InstancePool:
    def __init__(
        self,
        instances: list[BackendInstance],
        stats: ExecutionRecorder,
        label: str,
        limiter: RateLimiter | None = None,
        tickets: list[Ticket] | None = None,
    ) -> None:
        """``limiter``/``tickets``: ``--rate-limit=execution_count`` (``rate_limiter.py``), one ticket per
        instance: a slot is free only once it holds its resources."""
        self.instances = instances
        self.stats = stats
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{label}-{i}") for i in range(len(instances))
        ]
        self._free: asyncio.Queue[int] | None = None
        self._inline_ok = INLINE_BELOW_NS > 0 and all(i.may_run_on_loop for i in instances)
        #: moving average of execution time (ns) and how many executions it has seen
        self._average_ns = 0.0
        self._seen = 0
        #: the last inline execution took long by the wall clock: measure the next one's CPU time
        self._verify_next = False
        #: slots whose batch still runs although its caller was cancelled: freed when the batch ends
        self._held: dict[int, Future[tuple[list[RequestResult], int]] | asyncio.Future[list[RequestResult]]] = {}
        #: every instance works elsewhere (``async_loop`` and ``start``): ``submit`` may be used, on that loop
        self.direct = bool(instances) and all(i.async_loop is not None for i in instances)
        #: that loop, kept: ``asyncio.get_running_loop()`` costs a getpid() per call on Python 3.11
        self._loop: asyncio.AbstractEventLoop | None = instances[0].async_loop if self.direct else None
        #: batches ``submit`` could not start yet, oldest first, with the future of their results
        self._waiting: deque[tuple[Batch, asyncio.Future[list[RequestResult]]]] = deque()
        #: slots freed while ``_free_slot`` runs, for it to hand out (``_draining``)
        self._freed: deque[int] = deque()
        self._draining = False
        self._limiter = limiter if tickets is not None else None
        self._tickets = tickets if limiter is not None else None
        #: (rate limited) slots neither holding resources, nor asking for them, nor executing
        self._idle: set[int] = set(range(len(instances))) if self._tickets is not None else set()
        #: (rate limited) ``acquire`` calls waiting for a slot
        self._acquirers: deque[asyncio.Future[int]] = deque()
        #: (rate limited) whether the scheduler has work waiting (the dynamic batcher's queue), and what to
        #: call when a slot becomes free outside its own calls (the factory sets both)
        self.demand: Callable[[], bool] | None = None
        self.on_free: Callable[[], None] | None = None
        self._unused_timer: asyncio.TimerHandle | None = None

    def _queue(self) -> asyncio.Queue[int]:
        if self._free is None:  # created lazily: bound to the running loop
            self._free = asyncio.Queue()
            if self._tickets is None:  # rate limited: slots join once they hold their resources
                for i in range(len(self.instances)):
                    self._free.put_nowait(i)
        return self._free

    @property
    def size(self) -> int:
        return len(self.instances)

    def has_free(self) -> bool:
        if self._tickets is not None and self._queue().empty():
            self._want(1)  # its resources may be granted at once
        return not self._queue().empty()

    async def acquire(self) -> int:
        if self._tickets is None or not self._queue().empty():
            return await self._queue().get()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._acquirers.append(future)
        self._want(len(self._acquirers))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed a slot as its caller went away
                self._give_back(future.result())
            raise
        finally:
            if future in self._acquirers:
                self._acquirers.remove(future)

    # ---- rate limiter (``rate_limiter.py``) ------------------------------------------------------------------
    def _pending(self) -> int:
        """How many slots work waits for."""
        n = sum(1 for f in self._acquirers if not f.done()) + len(self._waiting)
        if n == 0 and self.demand is not None and self.demand():
            n = 1
        return n

    def _want(self, n: int) -> None:
        """Ask for resources for idle slots until ``n`` slots ask (lowest scaled priority first)."""
        assert self._tickets is not None and self._limiter is not None
        tickets = self._tickets
        asking = sum(1 for t in tickets if t.staged)
        while asking < n and self._idle:
            slot = min(self._idle, key=lambda i: (tickets[i].scaled_priority(), i))
            self._idle.discard(slot)
            asking += 1
            self._limiter.stage(tickets[slot], functools.partial(self._free_slot, slot))

    def _give_back(self, slot: int, executed: bool = False) -> None:
        """``slot`` holds resources it will not use (more): they go back; it asks again if work waits."""
        assert self._tickets is not None and self._limiter is not None
        ticket = self._tickets[slot]
        again = self._pending() > sum(1 for t in self._tickets if t.staged)
        self._limiter.release(ticket, executed, (lambda: self._free_slot(slot)) if again else None)
        if not ticket.staged and not ticket.holding:
            self._idle.add(slot)

    def _park(self, slot: int) -> None:
        """A slot holding its resources and no batch to start: to a waiting ``acquire``, else free."""
        while self._acquirers:
            future = self._acquirers.popleft()
            if not future.done():
                future.set_result(slot)
                return
        self._queue().put_nowait(slot)
        if self.on_free is not None:
            self.on_free()
        if self._unused_timer is None:
            self._unused_timer = asyncio.get_running_loop().call_later(UNUSED_GRANT_S, self._return_unused)

    def _return_unused(self) -> None:
        """Resources of free slots no work waits for go back to the limiter (other models may need them)."""
        self._unused_timer = None
        queue = self._queue()
        if queue.empty():
            return
        if self._pending():
            self._unused_timer = asyncio.get_running_loop().call_later(UNUSED_GRANT_S, self._return_unused)
            return
        while not queue.empty():
            self._give_back(queue.get_nowait())

    def take_free(self) -> int:
        """A free slot, at once (after ``has_free``): no coroutine, unlike ``acquire``."""
        return self._queue().get_nowait()

    @property
    def runs_inline(self) -> bool:
        """Whether the next ``execute`` runs on the event loop's thread (see the module docstring)."""
        return self._inline_ok and self._seen >= LEARN_EXECUTIONS and self._average_ns < INLINE_BELOW_NS

    @property
    def waiting(self) -> int:
        """Batches ``submit`` holds until an instance is free."""
        return len(self._waiting)

    def release(self, slot: int) -> None:
        running = self._held.pop(slot, None)
        if running is not None and not running.done():
            # the instance is still busy with the abandoned batch: free the slot when it finishes
            loop = asyncio.get_running_loop()
            running.add_done_callback(lambda _: loop.call_soon_threadsafe(self.release, slot))
            return
        if self._tickets is not None:
            if self.instances[slot].when_ready(lambda: self._ready_again(slot)):
                assert self._limiter is not None
                self._limiter.release(self._tickets[slot])
            else:
                self._give_back(slot, executed=True)
            return
        if self.instances[slot].when_ready(lambda: self._free_slot(slot)):
            return  # restarting (a Python model's stub): the other instances take the work meanwhile
        self._free_slot(slot)

    def _ready_again(self, slot: int) -> None:
        """(rate limited) a restarted instance is back: idle, and asking if work waits."""
        self._idle.add(slot)
        self._want(self._pending())

    def _free_slot(self, slot: int) -> None:
        """``slot`` is free: the oldest batch ``submit`` holds starts on it now, or it waits in the queue.

        An instance that answers at once (a stub that gave up fails each batch inside ``start``) frees its
        slot again from within this call: that slot joins the loop below instead of a deeper call, so a long
        line of waiting batches never nests calls."""
        self._freed.append(slot)
        if self._draining:
            return
        self._draining = True
        try:
            while self._freed:
                slot = self._freed.popleft()
                while self._waiting:
                    batch, future = self._waiting.popleft()
                    if future.done():  # its caller went away while it waited
                        continue
                    if any(r.cancelled for r in batch.requests):
                        future.set_exception(Cancelled("Request was cancelled"))
                        continue
                    self._start(slot, batch, future)
                    break
                else:
                    if self._tickets is not None:
                        self._park(slot)
                    else:
                        self._queue().put_nowait(slot)
        finally:
            self._draining = False

    def submit(self, batch: Batch) -> asyncio.Future[list[RequestResult]]:
        """On the loop, for a ``direct`` pool: ``batch`` starts on a free instance now, or on the first one
        to finish. A future of its results (execution statistics recorded); cancelling it abandons the
        results, never the execution, and the instance is free again when it ends."""
        assert self._loop is not None, "submit is for pools whose instances work elsewhere (direct)"
        future: asyncio.Future[list[RequestResult]] = self._loop.create_future()
        if self._tickets is not None and not self._waiting and self._queue().empty():
            self._waiting.append((batch, future))
            self._want(len(self._waiting))
        elif self._waiting or not self.has_free():
            self._waiting.append((batch, future))
        else:
            self._start(self.take_free(), batch, future)
        return future

    def _start(self, slot: int, batch: Batch, future: asyncio.Future[list[RequestResult]]) -> None:
        start = time.monotonic_ns()
        for r in batch.requests:
            r.compute_start_ns = start
        finished = False

        def done(results: list[RequestResult]) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            self.release(slot)  # first: the next waiting batch starts here, in this same callback
            self._record(batch, results)
            if not future.done():
                future.set_result(results)

        try:
            self.instances[slot].start(batch, done)  # type: ignore[attr-defined]
        except Exception as exc:  # the whole batch failed: every request gets the error
            done([exc] * len(batch.requests))

    async def execute(self, slot: int, batch: Batch) -> list[RequestResult]:
        """Run ``batch`` on instance ``slot`` (already acquired); records execution statistics."""
        if self._tickets is not None and not self._tickets[slot].holding:
            # a slot a scheduler keeps itself (sequence batcher) or a warmup: its resources for this batch
            return await self._execute_granted(slot, batch)
        start = time.monotonic_ns()
        for r in batch.requests:
            r.compute_start_ns = start
        instance = self.instances[slot]
        took: int | None = None
        if self.runs_inline:
            try:
                results, took = self._run_inline(instance, batch)
            except Exception as exc:  # the whole batch failed (backend crash): every request gets the error
                results = [exc] * len(batch.requests)
        elif instance.async_loop is not None and instance.async_loop is asyncio.get_running_loop():
            # the work happens in another process: await it here, no thread hand-off
            task: asyncio.Future[list[RequestResult]] = asyncio.get_running_loop().create_future()
            try:
                instance.start(batch, _resolver(task))  # type: ignore[attr-defined]
                results = await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.done():  # the caller went away; the batch still runs in the instance
                    self._held[slot] = task
                raise
            except Exception as exc:  # the whole batch failed: every request gets the error
                results = [exc] * len(batch.requests)
        else:
            running = self._executors[slot].submit(_cpu_timed, instance, batch)
            try:
                results, cpu_ns = await asyncio.wrap_future(running)
                took = cpu_ns
            except asyncio.CancelledError:
                if not running.done():  # the caller went away; the instance cannot be stopped mid-batch
                    self._held[slot] = running
                raise
            except Exception as exc:  # the whole batch failed (backend crash): every request gets the error
                results = [exc] * len(batch.requests)
        if self._inline_ok and took is not None:
            self._seen += 1
            self._average_ns = took if self._seen == 1 else 0.8 * self._average_ns + 0.2 * took
        self._record(batch, results)
        return results

    async def _execute_granted(self, slot: int, batch: Batch) -> list[RequestResult]:
        assert self._tickets is not None and self._limiter is not None
        ticket = self._tickets[slot]
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.discard(slot)

        def grant() -> None:
            if not granted.done():
                granted.set_result(None)

        self._limiter.stage(ticket, grant)
        try:
            await granted
        except BaseException:
            self._limiter.unstage(ticket)
            self._limiter.release(ticket, executed=False)
            self._idle.add(slot)
            raise
        try:
            return await self.execute(slot, batch)
        finally:
            self._limiter.release(ticket)
            self._idle.add(slot)

    def _record(self, batch: Batch, results: list[RequestResult]) -> None:
        for r in batch.requests:
            r.timings = batch.timings
        rows = _executed_rows(batch, results)
        if rows:
            self.stats.record_execution(rows, batch.timings)

    def _run_inline(self, instance: BackendInstance, batch: Batch) -> tuple[list[RequestResult], int | None]:
        """``instance.execute(batch)`` on this thread, and its CPU time for the average when known.

        The thread's CPU clock is a system call, a noticeable part of a short request's CPU when read twice
        per execution, so the wall clock is read instead: on
        this one thread the CPU time is at most the wall time, so a short wall time is a (high) CPU sample.
        A long one may be a slow model or a busy machine: the next run measures CPU time to tell, and keeps
        measuring while the CPU time stays long.
        """
        if self._verify_next:
            t0 = time.thread_time_ns()
            results = instance.execute(batch)
            took = time.thread_time_ns() - t0
            self._verify_next = took >= INLINE_BELOW_NS
            return results, took
        t0 = time.perf_counter_ns()
        results = instance.execute(batch)
        wall = time.perf_counter_ns() - t0
        if wall < INLINE_BELOW_NS:
            return results, wall
        self._verify_next = True
        return results, None

    def ready(self) -> bool:
        """Triton's model readiness: every instance ready (a Python stub restarting is not)."""
        return all(i.ready() for i in self.instances)

    def unready_reason(self) -> str:
        return next((r for i in self.instances if (r := i.unready_reason())), "")

    async def run(self, batch: Batch) -> list[RequestResult]:
        slot = await self.acquire()
        try:
            return await self.execute(slot, batch)
        finally:
            self.release(slot)

    def close(self) -> None:
        if self._tickets is not None and self._limiter is not None:
            self._limiter.unregister_soon(self._tickets)
            self._tickets = None
        for executor, instance in zip(self._executors, self.instances, strict=True):
            executor.submit(instance.close).result()
            executor.shutdown(wait=True)
        self.instances = []
