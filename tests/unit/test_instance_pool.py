"""InstancePool runs short executions on the event loop's thread, long ones (and unsafe backends) on theirs."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from kubeinfer.server.backends.base import BackendInstance, Batch, RequestResult
from kubeinfer.server.scheduling import instance_pool
from kubeinfer.server.scheduling.instance_pool import InstancePool
from kubeinfer.server.vocabulary.errors import Cancelled
from kubeinfer.server.vocabulary.types import ExecutionTimings, InferenceRequest


class Recorder:
    def record_execution(self, batch_size: int, timings: ExecutionTimings) -> None:
        pass


class Timed(BackendInstance):
    """Spends the CPU time it is told to and records where it ran."""

    may_run_on_loop = True

    def __init__(self) -> None:
        self.took_ns = 10_000
        #: the thread each execution ran on
        self.threads: list[int] = []

    def execute(self, batch: Batch) -> list[RequestResult]:
        self.threads.append(threading.get_ident())
        until = time.thread_time_ns() + self.took_ns
        while time.thread_time_ns() < until:
            pass
        return [{"OUT": np.zeros(1)} for _ in batch.requests]


class Unsafe(Timed):
    may_run_on_loop = False  # e.g. a Python model whose BLS calls wait on the loop


def _batch() -> Batch:
    return Batch([InferenceRequest(model_name="m", model_version="", inputs={"IN": np.zeros((1, 1))})], 8)


async def _run(pool: InstancePool, times: int) -> None:
    for _ in range(times):
        await pool.run(_batch())


def test_short_executions_move_to_the_loop_and_back_when_they_get_slow() -> None:
    instance = Timed()
    pool = InstancePool([instance], Recorder(), "m")

    async def scenario() -> None:
        await _run(pool, instance_pool.LEARN_EXECUTIONS)  # learning: on the instance's thread
        assert threading.get_ident() not in instance.threads
        instance.threads.clear()
        await _run(pool, 3)
        assert instance.threads == [threading.get_ident()] * 3  # the loop's own thread
        instance.took_ns = 3 * instance_pool.INLINE_BELOW_NS  # the model got slow (bigger batches)
        await _run(pool, 4)
        instance.threads.clear()
        await _run(pool, 2)
        assert instance.threads and threading.get_ident() not in instance.threads

    asyncio.run(scenario())
    pool.close()


class Sleepy(Timed):
    """Takes long by the wall clock but hardly any CPU, like a run that waited for a core."""

    def execute(self, batch: Batch) -> list[RequestResult]:
        self.threads.append(threading.get_ident())
        time.sleep(self.took_ns / 1e9)
        return [{"OUT": np.zeros(1)} for _ in batch.requests]


def test_a_long_wall_time_without_cpu_time_stays_on_the_loop() -> None:
    instance = Sleepy()
    pool = InstancePool([instance], Recorder(), "m")

    async def scenario() -> None:
        await _run(pool, instance_pool.LEARN_EXECUTIONS)
        instance.took_ns = 3 * instance_pool.INLINE_BELOW_NS  # slow by the clock only (a busy machine)
        instance.threads.clear()
        await _run(pool, 6)
        assert instance.threads == [threading.get_ident()] * 6

    asyncio.run(scenario())
    pool.close()


def test_instances_that_may_not_run_on_the_loop_never_do() -> None:
    instance = Unsafe()
    pool = InstancePool([instance], Recorder(), "m")
    loop_thread = threading.get_ident()  # asyncio.run's loop runs on this thread
    asyncio.run(_run(pool, 3 * instance_pool.LEARN_EXECUTIONS))
    assert len(instance.threads) == 3 * instance_pool.LEARN_EXECUTIONS and loop_thread not in instance.threads
    pool.close()


class Remote(BackendInstance):
    """Works "in another process": ``start`` keeps the batch until the test answers it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.async_loop = loop
        self.running: list[tuple[Batch, object]] = []
        #: what was running on this instance at the moment each batch started
        self.busy_at_start: list[int] = []

    def execute(self, batch: Batch) -> list[RequestResult]:
        raise AssertionError("a pool of remote instances never calls execute on a thread")

    def start(self, batch: Batch, done: object) -> None:
        self.busy_at_start.append(len(self.running))
        self.running.append((batch, done))

    def answer(self) -> None:
        batch, done = self.running.pop(0)
        done([{"OUT": np.full(1, float(id(batch)))} for _ in batch.requests])  # type: ignore[operator]


def _remote_pool(count: int) -> tuple[InstancePool, list[Remote]]:
    """On the running loop: a pool of ``count`` remote instances."""
    instances = [Remote(asyncio.get_running_loop()) for _ in range(count)]
    return InstancePool(list(instances), Recorder(), "m"), instances


def test_the_next_waiting_batch_starts_inside_the_callback_that_saw_an_instance_finish() -> None:
    """No loop turn between one batch's answer and the next batch's start: the instance never idles while
    batches wait (a waiting coroutine would be woken only turns later)."""

    async def scenario() -> None:
        pool, (a, b) = _remote_pool(2)
        assert pool.direct
        futures = [pool.submit(_batch()) for _ in range(5)]
        assert (len(a.running), len(b.running), pool.waiting) == (1, 1, 3)
        a.answer()  # synchronously: the oldest waiting batch is on `a` before this returns
        assert (len(a.running), pool.waiting) == (1, 2)
        assert futures[0].done() and not futures[2].done()
        b.answer()
        a.answer()
        assert pool.waiting == 0 and len(a.running) + len(b.running) == 2
        a.answer()
        b.answer()
        results = await asyncio.gather(*futures)
        assert all(isinstance(r[0], dict) for r in results)
        assert a.busy_at_start == [0] * len(a.busy_at_start)  # one batch at a time per instance
        assert b.busy_at_start == [0] * len(b.busy_at_start)
        assert pool.has_free() and pool.waiting == 0

    asyncio.run(scenario())


def test_a_waiting_batch_whose_caller_left_or_was_cancelled_never_starts() -> None:
    async def scenario() -> None:
        pool, (a,) = _remote_pool(1)
        first = pool.submit(_batch())
        gone = pool.submit(_batch())
        cancelled_batch = _batch()
        cancelled = pool.submit(cancelled_batch)
        last = pool.submit(_batch())
        gone.cancel()  # the client's coroutine went away
        cancelled_batch.requests[0].cancelled = True  # the client cancelled the request
        a.answer()
        assert first.done() and len(a.running) == 1 and a.running[0][0] is not cancelled_batch
        assert isinstance(cancelled.exception(), Cancelled)
        a.answer()
        assert last.done() and pool.waiting == 0 and pool.has_free()

    asyncio.run(scenario())


def test_a_batch_whose_caller_left_while_it_ran_still_frees_its_instance() -> None:
    async def scenario() -> None:
        pool, (a,) = _remote_pool(1)
        running = pool.submit(_batch())
        queued = pool.submit(_batch())
        running.cancel()
        a.answer()  # the abandoned batch ends: the instance takes the queued one
        assert len(a.running) == 1
        a.answer()
        assert queued.done() and pool.has_free()

    asyncio.run(scenario())


class GaveUp(Remote):
    """Fails every batch inside ``start`` (a stub that died too often)."""

    def start(self, batch: Batch, done: object) -> None:
        done([RuntimeError("Stub process 'm_0' is not healthy.")] * len(batch.requests))  # type: ignore[operator]


def test_an_instance_that_fails_each_batch_at_once_fails_a_long_line_of_waiting_batches_without_nesting() -> None:
    async def scenario() -> None:
        pool, (a,) = _remote_pool(1)
        futures = [pool.submit(_batch()) for _ in range(5000)]  # one runs, the rest wait
        pool.instances[0] = GaveUp(asyncio.get_running_loop())
        a.answer()  # each waiting batch now fails inside start, which frees the slot again at once
        assert all(f.done() for f in futures) and pool.waiting == 0 and pool.has_free()
        assert all(isinstance(f.result()[0], RuntimeError) for f in futures[1:])

    asyncio.run(scenario())
