"""Dynamic batching against a real server: batch formation, delay, queue policy, priorities, ordering.

The ``sleep`` test backend holds an execution at a gate until the test opens it, so the tests build
backlogs on purpose: they wait for observable events (an execution at the gate, the pending-request gauge,
responses) instead of sleeping, and assert exact batch sizes, counts and execution order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import (
    Gate,
    executions,
    infer_body,
    output,
    post_infer,
    require_sleep_backend,
    stats,
    wait_pending,
    write_sleep_model,
)
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    require_sleep_backend()
    repo = tmp_path_factory.mktemp("batching") / "repo"
    write_sleep_model(
        repo,
        "preferred",
        50,
        """
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 20000 }
    """,
    )
    write_sleep_model(
        repo,
        "backlog",
        50,
        """
        dynamic_batching { preferred_batch_size: [ 4, 6 ] max_queue_delay_microseconds: 20000 }
    """,
    )
    write_sleep_model(repo, "greedy", 30, "dynamic_batching { }\n")
    write_sleep_model(repo, "delayed", 0, "dynamic_batching { max_queue_delay_microseconds: 2000000 }\n")
    # an hour's delay: only a full batch can leave
    write_sleep_model(repo, "held", 0, "dynamic_batching { max_queue_delay_microseconds: 3600000000 }\n")
    write_sleep_model(
        repo,
        "queue_limited",
        0,
        """
        dynamic_batching { default_queue_policy { max_queue_size: 2 } }
    """,
        max_batch_size=1,
    )
    write_sleep_model(
        repo,
        "timeout_reject",
        0,
        """
        dynamic_batching {
          default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 300000
                                 allow_timeout_override: true }
        }
    """,
        max_batch_size=1,
    )
    write_sleep_model(
        repo,
        "timeout_delay",
        0,
        """
        dynamic_batching {
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000
                                 allow_timeout_override: true }
        }
    """,
        max_batch_size=1,
    )
    write_sleep_model(
        repo,
        "prioritized",
        0,
        """
        dynamic_batching { priority_levels: 2 default_priority_level: 2 }
    """,
        max_batch_size=1,
    )
    for name, ordered in (("ordered", "true"), ("unordered", "false")):
        write_sleep_model(
            repo,
            name,
            0,
            f"""
            dynamic_batching {{ preserve_ordering: {ordered} }}
            instance_group [ {{ count: 2 kind: KIND_CPU }} ]
        """,
            max_batch_size=1,
        )
    srv = start_server(repo, log_dir=repo.parent)
    yield srv
    srv.terminate()


def _flood(server: ServerProcess, model: str, n: int, rows: int = 1, **params: object) -> list[tuple]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: post_infer(server.base_url, model, infer_body(rows=rows, **params)), range(n)))


def test_concurrent_clients_form_batches_within_max(server: ServerProcess, tmp_path: Path) -> None:
    """32 concurrent clients send 128 requests: every batch stays within max_batch_size, every row comes
    back to its sender. The first request is held at a gate until the 32 clients' requests queue behind it:
    those leave as 4 batches of 8, the largest preferred size; how the rest batch depends on how fast
    the clients come back, so only sums are asserted for them."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=32)
    rows = [np.full((1, 6), i, dtype=np.float32) for i in range(128)]
    try:
        with Gate(tmp_path) as gate, ThreadPoolExecutor(2) as helpers:
            first = helpers.submit(
                post_infer, server.base_url, "preferred", infer_body(rows[0][0].tolist(), **gate.params)
            )
            gate.wait_entered()

            def open_when_queued() -> None:  # runs while the clients below wait for answers
                try:
                    wait_pending(server.metrics_url, "preferred", 32)
                finally:
                    gate.open()

            opener = helpers.submit(open_when_queued)
            jobs = []
            for data in rows[1:]:
                inp = httpclient.InferInput("INPUT0", [1, 6], "FP32")
                inp.set_data_from_numpy(data, binary_data=True)
                jobs.append(client.async_infer("preferred", [inp]))
            for data, job in zip(rows[1:], jobs, strict=True):
                np.testing.assert_array_equal(job.get_result().as_numpy("OUTPUT0"), data)
            opener.result()
            status, answer, _ = first.result()
            assert status == 200 and output(answer, "OUTPUT0").tolist() == rows[0].tolist()
    finally:
        client.close()
    s = stats(server.base_url, "preferred")
    assert s["inference_count"] == 128
    assert s["inference_stats"]["success"]["count"] == 128
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    assert max(sizes) <= 8
    assert sum(size * n for size, n in sizes.items()) == 128
    assert sum(sizes.values()) == s["execution_count"]
    assert sizes.get(8, 0) >= 4, sizes  # the queued 32 left in the largest preferred size


def test_backlog_leaves_in_preferred_batch_sizes(server: ServerProcess, tmp_path: Path) -> None:
    """A request held at a gate occupies the single instance while 127 more queue: they leave in batches
    of 6, the largest preferred size, although max_batch_size (8) would allow more; the last one waits out
    the queue delay and leaves alone."""

    async def run(gate: Gate) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            url = "/v2/models/backlog/infer"
            blocker = asyncio.create_task(client.post(url, json=infer_body(**gate.params)))
            await asyncio.to_thread(gate.wait_entered)
            rest = [asyncio.create_task(client.post(url, json=infer_body())) for _ in range(127)]
            await asyncio.to_thread(wait_pending, server.metrics_url, "backlog", 127)
            gate.open()
            return await asyncio.gather(blocker, *rest)

    with Gate(tmp_path) as gate:
        responses = asyncio.run(run(gate))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:3]
    s = stats(server.base_url, "backlog")
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    # the blocker and the queue's tail ran alone; 126 = 21 x 6 (a greedy batcher would send 8s)
    assert sizes == {1: 2, 6: 21}, sizes


def test_batches_count_rows_and_never_split_requests(server: ServerProcess) -> None:
    """Requests of 3 rows each under max_batch_size 8: at most 2 per batch, never split."""
    results = _flood(server, "greedy", 12, rows=3)
    for status, answer, _ in results:
        assert status == 200, answer
        assert output(answer, "OUTPUT0").shape == (3, 2)
        assert int(output(answer, "BATCH")[0, 0]) in (3, 6)
    s = stats(server.base_url, "greedy")
    assert {b["batch_size"] for b in s["batch_stats"]} <= {3, 6}
    assert s["inference_count"] == 36


def test_differing_shapes_cut_the_batch(server: ServerProcess) -> None:
    bodies = [infer_body([1.0, 2.0]) if i % 2 else infer_body([1.0, 2.0, 3.0]) for i in range(10)]
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda b: post_infer(server.base_url, "greedy", b), bodies))
    for body, (status, answer, _) in zip(bodies, results, strict=True):
        assert status == 200, answer
        assert output(answer, "OUTPUT0").tolist() == [body["inputs"][0]["data"]]


def test_lone_request_waits_for_the_queue_delay(server: ServerProcess) -> None:
    status, answer, seconds = post_infer(server.base_url, "delayed", infer_body())
    assert status == 200, answer
    # max_queue_delay is 2 s and nothing else arrives to fill the batch: the server's own queue time says so
    queue = stats(server.base_url, "delayed")["inference_stats"]["queue"]
    assert queue["count"] == 1 and queue["ns"] >= 2_000_000_000, queue
    assert seconds >= 2.0


def test_full_batch_is_sent_without_waiting_for_the_delay(server: ServerProcess) -> None:
    """max_queue_delay is an hour: only reaching max_batch_size sends these 8 requests."""
    results = _flood(server, "held", 8)
    assert all(status == 200 for status, _, _ in results)
    assert [int(output(a, "BATCH")[0, 0]) for _, a, _ in results] == [8] * 8


def test_queue_full_rejects_the_excess(server: ServerProcess, tmp_path: Path) -> None:
    """One request executes (held), max_queue_size 2 queue behind it, the other 5 are refused at once."""
    url = server.base_url
    with Gate(tmp_path) as gate, ThreadPoolExecutor(8) as pool:
        held = pool.submit(post_infer, url, "queue_limited", infer_body(**gate.params))
        gate.wait_entered()
        queued = [pool.submit(post_infer, url, "queue_limited", infer_body()) for _ in range(2)]
        wait_pending(server.metrics_url, "queue_limited", 2)
        excess = [pool.submit(post_infer, url, "queue_limited", infer_body()) for _ in range(5)]
        for f in excess:  # answered while the gate is still closed
            status, answer, _ = f.result()
            assert status == 503, answer
            assert "maximum queue size" in answer["error"]
        gate.open()
        assert [f.result()[0] for f in (held, *queued)] == [200] * 3
    s = stats(server.base_url, "queue_limited")
    assert s["inference_stats"]["fail"]["count"] == 5
    assert s["inference_stats"]["success"]["count"] == 3


def test_queue_full_is_unavailable_over_grpc(server: ServerProcess, tmp_path: Path) -> None:
    url = server.base_url
    with Gate(tmp_path) as gate, ThreadPoolExecutor(3) as pool:
        held = pool.submit(post_infer, url, "queue_limited", infer_body(**gate.params))
        gate.wait_entered()
        queued = [pool.submit(post_infer, url, "queue_limited", infer_body()) for _ in range(2)]
        wait_pending(server.metrics_url, "queue_limited", 2)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 2), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("queue_limited", [inp])
        assert "UNAVAILABLE" in str(info.value.status()) and "maximum queue size" in info.value.message()
        client.close()
        gate.open()
        assert [f.result()[0] for f in (held, *queued)] == [200] * 3


def test_timeout_reject(server: ServerProcess, tmp_path: Path) -> None:
    """One request executes (held); the queued ones time out after 0.3 s and are rejected meanwhile."""
    url = server.base_url
    bodies = [infer_body(), infer_body(timeout=10_000_000)]  # a request cannot raise its timeout
    with Gate(tmp_path) as gate, ThreadPoolExecutor(3) as pool:
        first = pool.submit(post_infer, url, "timeout_reject", infer_body(**gate.params))
        gate.wait_entered()
        rest = [pool.submit(post_infer, url, "timeout_reject", b) for b in bodies]
        for f in rest:  # answered while the gate is still closed
            status, answer, _ = f.result()
            assert status == 503, answer
            assert "timeout" in answer["error"].lower()
        gate.open()
        status, answer, _ = first.result()
        assert status == 200, answer
    # a request's own shorter timeout is honoured too
    with Gate(tmp_path) as gate, ThreadPoolExecutor(1) as pool:
        busy = pool.submit(post_infer, url, "timeout_reject", infer_body(**gate.params))
        gate.wait_entered()
        status, answer, _ = post_infer(url, "timeout_reject", infer_body(timeout=50_000))
        assert status == 503 and "timeout" in answer["error"].lower()
        gate.open()
        assert busy.result()[0] == 200


def test_timeout_delay_moves_expired_requests_behind(server: ServerProcess, tmp_path: Path) -> None:
    """A executes (held); B's own 1 µs timeout expires in the queue, so C, which came later, runs before B,
    which still runs (timeout_action DELAY)."""
    url = server.base_url
    with Gate(tmp_path) as gate, ThreadPoolExecutor(3) as pool:
        a = pool.submit(post_infer, url, "timeout_delay", infer_body(**gate.params))
        gate.wait_entered()
        b = pool.submit(post_infer, url, "timeout_delay", infer_body(timeout=1))
        wait_pending(server.metrics_url, "timeout_delay", 1)
        c = pool.submit(post_infer, url, "timeout_delay", infer_body())
        wait_pending(server.metrics_url, "timeout_delay", 2)
        gate.open()
        answers = {}
        for name, f in (("A", a), ("B", b), ("C", c)):
            status, answers[name], _ = f.result()
            assert status == 200, answers[name]
    order = {name: executions(answer) for name, answer in answers.items()}
    assert order["A"] < order["C"] < order["B"], order


def test_priority_overtakes_the_backlog(server: ServerProcess, tmp_path: Path) -> None:
    """While one low-priority request executes (held) 5 more queue; a high-priority one jumps all of them."""
    url = server.base_url
    with Gate(tmp_path) as gate, ThreadPoolExecutor(7) as pool:
        held = pool.submit(post_infer, url, "prioritized", infer_body(**gate.params))
        gate.wait_entered()
        low = [pool.submit(post_infer, url, "prioritized", infer_body()) for _ in range(5)]
        wait_pending(server.metrics_url, "prioritized", 5)
        high = pool.submit(post_infer, url, "prioritized", infer_body(priority=1))
        wait_pending(server.metrics_url, "prioritized", 6)
        gate.open()
        answers = [f.result() for f in (held, high, *low)]
    assert all(status == 200 for status, _, _ in answers), answers
    order = [executions(answer) for _, answer, _ in answers]
    assert order[:2] == [1, 2] and sorted(order[2:]) == [3, 4, 5, 6, 7], order


def test_priority_outside_the_levels_is_a_client_error(server: ServerProcess) -> None:
    status, answer, _ = post_infer(server.base_url, "prioritized", infer_body(priority=3))
    assert status == 400
    assert "priority 3" in answer["error"]


@pytest.mark.parametrize(("model", "ordered"), [("ordered", True), ("unordered", False)])
def test_preserve_ordering(server: ServerProcess, tmp_path: Path, model: str, ordered: bool) -> None:
    """A held request, then a second one that executes at once on the other instance: with preserve_ordering
    its answer waits for the held one's, without it comes back at once."""
    url = server.base_url
    with Gate(tmp_path) as gate, ThreadPoolExecutor(2) as pool:
        held = pool.submit(post_infer, url, model, infer_body(**gate.params))
        gate.wait_entered()
        second = pool.submit(post_infer, url, model, infer_body())
        if ordered:
            wait_for("the second request executed", lambda: stats(url, model)["execution_count"] == 1)
            # it is done and held back: a broken implementation would answer within this second
            answered, _ = wait([second], timeout=1.0)
            assert not answered, "preserve_ordering: a later request was answered before an earlier one"
        else:
            status, answer, _ = second.result()  # while the first is still held
            assert status == 200, answer
            assert not held.done()
        gate.open()
        assert held.result()[0] == 200 and second.result()[0] == 200
    assert {int(output(a, "INSTANCE")[0, 0]) for _, a, _ in (held.result(), second.result())} == {0, 1}
