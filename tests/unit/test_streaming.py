"""ResponseStream: responses from any thread, in the order sent, ending with the final item."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from kubeinfer.server.vocabulary.errors import InvalidArgument
from kubeinfer.server.vocabulary.streaming import ResponseStream
from kubeinfer.server.vocabulary.types import InferenceRequest


def _collect(sends: int, threads: int) -> list[tuple[int, int]]:
    async def main() -> list[tuple[int, int]]:
        stream = ResponseStream(InferenceRequest("m", id="r"), "m", "1")
        done = threading.Barrier(threads + 1)

        def produce(t: int) -> None:
            for i in range(sends):
                stream.send({"OUT": np.array([t, i])})
            done.wait()

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        await asyncio.to_thread(done.wait)
        stream.send(None, final=True)
        seen = []
        async for item in stream:
            if item.response is not None:
                seen.append(tuple(int(v) for v in item.response.outputs["OUT"]))
            else:
                assert item.final
        return seen

    return asyncio.run(main())


def test_every_response_arrives_in_each_producers_order() -> None:
    seen = _collect(sends=200, threads=4)
    assert len(seen) == 800
    for t in range(4):
        assert [i for (tt, i) in seen if tt == t] == list(range(200))


def test_nothing_after_the_final_item() -> None:
    async def main() -> None:
        stream = ResponseStream(InferenceRequest("m"), "m", "1")
        assert stream.send({"OUT": np.zeros(1)}, final=True)
        assert not stream.send({"OUT": np.zeros(1)})
        assert not stream.fail(InvalidArgument("late"))
        items = [item async for item in stream]
        assert len(items) == 1 and items[0].final and items[0].response is not None
        assert items[0].response.model_version == "1"

    asyncio.run(main())


def test_cancel_marks_the_request_and_runs_hooks_once() -> None:
    async def main() -> None:
        request = InferenceRequest("m")
        stream = ResponseStream(request, "m", "1")
        calls: list[int] = []
        stream.on_cancel(lambda: calls.append(1))
        stream.cancel()
        stream.cancel()
        assert request.cancelled and calls == [1]

    asyncio.run(main())


def test_an_error_item_carries_no_response() -> None:
    async def main() -> None:
        stream = ResponseStream(InferenceRequest("m"), "m", "1")
        stream.send({"OUT": np.zeros(1)}, error=InvalidArgument("bad"), final=False)
        stream.fail(InvalidArgument("worse"))
        items = [item async for item in stream]
        assert [(i.response, i.error.message if i.error else None, i.final) for i in items] == [
            (None, "bad", False),
            (None, "worse", True),
        ]

    asyncio.run(main())
