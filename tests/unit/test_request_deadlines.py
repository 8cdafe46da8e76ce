"""RequestDeadlines: one timer cancels each request at its own deadline, and never a finished one."""

from __future__ import annotations

import asyncio

from kubeinfer.server.runtime.deadlines import RequestDeadlines


async def _request(deadlines: RequestDeadlines, timeout: float, work: float, log: list[tuple[str, float]]) -> str:
    loop = asyncio.get_running_loop()
    deadline = deadlines.start(timeout)
    assert deadline is not None
    try:
        await asyncio.sleep(work)
        return "answered"
    except asyncio.CancelledError:
        assert deadline.expired
        log.append(("expired", loop.time() - (deadline.when - timeout)))
        deadline.task.uncancel()
        return "timed out"
    finally:
        deadlines.finish(deadline)


def test_each_request_expires_at_its_own_deadline_and_finished_ones_never() -> None:
    async def main() -> None:
        deadlines = RequestDeadlines()
        log: list[tuple[str, float]] = []
        fast = [asyncio.create_task(_request(deadlines, 0.2, 0.01, log)) for _ in range(5)]
        slow = asyncio.create_task(_request(deadlines, 0.2, 5, log))
        await asyncio.sleep(0.05)
        later = asyncio.create_task(_request(deadlines, 0.2, 5, log))  # its deadline is 50 ms after slow's
        short = asyncio.create_task(_request(deadlines, 0.05, 5, log))  # a shorter timeout comes due first
        assert [await t for t in fast] == ["answered"] * 5
        assert await short == "timed out"
        assert await slow == "timed out"
        assert await later == "timed out"
        elapsed = [e for _, e in log]
        assert all(e >= t for e, t in zip(elapsed, (0.05, 0.2, 0.2), strict=True)), elapsed
        assert deadlines.in_flight == 0  # none left behind, expired or answered
        # a request that finishes in time is left alone although the timer armed for it still fires
        assert await _request(deadlines, 0.05, 0.01, log) == "answered"
        await asyncio.sleep(0.1)
        assert len(log) == 3

    asyncio.run(main())


def test_a_second_event_loop_gets_its_own_timer() -> None:
    deadlines = RequestDeadlines()
    for _ in range(2):
        log: list[tuple[str, float]] = []
        assert asyncio.run(_request(deadlines, 0.05, 1, log)) == "timed out"


def test_no_deadline_outside_a_task() -> None:
    async def main() -> None:
        got = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(lambda: got.set_result(RequestDeadlines().start(1.0)))  # a callback
        assert await got is None

    asyncio.run(main())
