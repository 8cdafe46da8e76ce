"""The dynamic batcher's decisions, in process: a real InstancePool over a recording backend instance."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import pytest
from kubeinfer.server.backends.base import Batch, TensorBackendInstance
from kubeinfer.server.config import parse_config_text
from kubeinfer.server.observability.stats import ModelStats
from kubeinfer.server.scheduling.dynamic_batcher import DynamicBatcher
from kubeinfer.server.scheduling.instance_pool import InstancePool
from kubeinfer.server.vocabulary.errors import InvalidArgument, QueueRejected
from kubeinfer.server.vocabulary.types import InferenceRequest


class Gated(TensorBackendInstance):
    """Echo model that blocks until released, recording each batch's request ids."""

    output_names = ["OUT"]

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.batches: list[list[str]] = []

    def execute(self, batch: Batch):  # type: ignore[no-untyped-def]
        self.gate.acquire()
        self.batches.append([r.id for r in batch.requests])
        return super().execute(batch)

    def run(self, inputs, output_names):  # type: ignore[no-untyped-def]
        return {"OUT": inputs["IN"] * 2}


def make(config_body: str, max_batch_size: int = 8) -> tuple[DynamicBatcher, Gated]:
    config = parse_config_text(f'name: "m"\nmax_batch_size: {max_batch_size}\n{config_body}')
    instance = Gated()
    pool = InstancePool([instance], ModelStats("m", "1"), "m")
    return DynamicBatcher(pool, config), instance


def req(rid: str, rows: int = 1, width: int = 2, **kw: int) -> InferenceRequest:
    return InferenceRequest("m", inputs={"IN": np.full((rows, width), 1.0, np.float32)}, id=rid, **kw)


async def until(predicate: Callable[[], object]) -> None:
    """Let the event loop run until the batcher's state satisfies ``predicate`` (run() bounds the wait)."""
    while not predicate():
        await asyncio.sleep(0.001)


def executing(b: DynamicBatcher) -> Callable[[], bool]:
    """The only instance took a batch (it is held at the gate)."""
    return lambda: not b.pool.has_free()


def run(coro) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(asyncio.wait_for(coro, 30))


def test_backlog_goes_out_as_the_largest_preferred_batch() -> None:
    async def main() -> None:
        b, inst = make("dynamic_batching { preferred_batch_size: [ 2, 4 ] }")
        await b.start()
        first = asyncio.create_task(b.submit(req("busy")))
        await until(executing(b))  # no delay: "busy" goes alone and occupies the only instance
        rest = [asyncio.create_task(b.submit(req(f"r{i}"))) for i in range(7)]
        await until(lambda: b.pending == 7)
        for _ in range(4):
            inst.gate.release()
        await asyncio.gather(first, *rest)
        assert inst.batches == [["busy"], ["r0", "r1", "r2", "r3"], ["r4", "r5"], ["r6"]]
        await b.close()

    run(main())


def test_preferred_size_is_waited_for_until_the_delay() -> None:
    async def main() -> None:
        b, inst = make("dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 10000000 }")
        await b.start()
        tasks = [asyncio.create_task(b.submit(req(f"r{i}"))) for i in range(2)]
        await until(lambda: b.pending == 2)
        await asyncio.sleep(0.2)  # the batcher had time to look: 2 rows reach no preferred size, they wait
        assert b.pending == 2 and b.pool.has_free() and inst.batches == []
        tasks.append(asyncio.create_task(b.submit(req("r2"))))
        inst.gate.release()
        await asyncio.gather(*tasks)
        assert inst.batches == [["r0", "r1", "r2"]]
        await b.close()

    run(main())


def test_rows_shapes_and_max_batch_size_cut_batches() -> None:
    async def main() -> None:
        b, inst = make("dynamic_batching { }", max_batch_size=4)
        await b.start()
        tasks = [asyncio.create_task(b.submit(req("busy")))]
        await until(executing(b))
        tasks += [
            asyncio.create_task(b.submit(r))
            for r in (
                req("a", rows=3),
                req("b", rows=2),
                req("c", rows=2),
                req("d", width=3),
                req("e", width=3),
            )
        ]
        await until(lambda: b.pending == 5)
        for _ in range(4):
            inst.gate.release()
        results = await asyncio.gather(*tasks)
        assert inst.batches == [["busy"], ["a"], ["b", "c"], ["d", "e"]]
        assert results[1]["OUT"].shape == (3, 2) and results[4]["OUT"].shape == (1, 3)
        await b.close()

    run(main())


def test_priority_levels_and_delay_policy() -> None:
    async def main() -> None:
        b, inst = make(
            """dynamic_batching {
            priority_levels: 2 default_priority_level: 2
            default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 300000 }
            priority_queue_policy { key: 1 value { max_queue_size: 1 } }
        }""",
            max_batch_size=1,
        )
        await b.start()
        busy = asyncio.create_task(b.submit(req("busy")))
        await until(executing(b))
        old = asyncio.create_task(b.submit(req("old")))  # default level 2: expires after 300 ms → delayed
        await until(lambda: len(b.queue.levels[1].delayed) == 1)
        fresh = asyncio.create_task(b.submit(req("fresh")))
        high = asyncio.create_task(b.submit(req("high", priority=1)))
        await until(lambda: b.pending == 3)
        with pytest.raises(QueueRejected, match="maximum queue size"):
            await b.submit(req("high2", priority=1))
        with pytest.raises(InvalidArgument, match="priority 3"):
            await b.submit(req("bad", priority=3))
        for _ in range(4):
            inst.gate.release()
        await asyncio.gather(busy, old, fresh, high)
        assert inst.batches == [["busy"], ["high"], ["fresh"], ["old"]]
        await b.close()

    run(main())


def test_reject_timeout_and_preserve_ordering() -> None:
    async def main() -> None:
        b, inst = make(
            """dynamic_batching {
            preserve_ordering: true
            default_queue_policy { default_timeout_microseconds: 50000 allow_timeout_override: true }
        }""",
            max_batch_size=1,
        )
        await b.start()
        busy = asyncio.create_task(b.submit(req("busy")))
        await until(executing(b))
        late = asyncio.create_task(b.submit(req("late", timeout_us=10_000_000)))  # cannot raise the timeout
        await until(lambda: b.pending == 1)
        await until(lambda: b.pending == 0)  # rejected after 50 ms, the answer held back ...
        await asyncio.sleep(0.1)
        assert not late.done()  # ... until "busy", which arrived first, is answered
        inst.gate.release()
        await busy
        with pytest.raises(QueueRejected, match="timeout"):
            await late
        await b.close()

    run(main())
