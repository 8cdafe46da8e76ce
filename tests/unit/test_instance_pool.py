"""InstancePool runs short executions on the event loop's thread, long ones (and unsafe backends) on theirs."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from kubeinfer.server.backends.base import BackendInstance, Batch, RequestResult
from kubeinfer.server.scheduling import instance_pool
from kubeinfer.server.scheduling.instance_pool import InstancePool
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
