"""Dynamic batching against a real server: batch formation, delay, queue policy, priorities, ordering.

The ``sleep`` test backend makes execution time known, so the tests can build backlogs on purpose;
every bound on time is generous (the machine is shared) and most assertions are about order and counts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server
from tests.support.sleep_models import (
    infer_body,
    output,
    pending,
    post_infer,
    require_sleep_backend,
    stats,
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
    write_sleep_model(
        repo,
        "queue_limited",
        2000,
        """
        dynamic_batching { default_queue_policy { max_queue_size: 2 } }
    """,
        max_batch_size=1,
    )
    write_sleep_model(
        repo,
        "timeout_reject",
        1500,
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
        1500,
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
        300,
        """
        dynamic_batching { priority_levels: 2 default_priority_level: 2 }
    """,
        max_batch_size=1,
    )
    for name, ordered in (("ordered", "true"), ("unordered", "false")):
        write_sleep_model(
            repo,
            name,
            100,
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


def test_concurrent_clients_form_batches_within_max(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=32)
    try:
        data = np.arange(6, dtype=np.float32).reshape(1, 6)
        pending_requests = []
        for _ in range(128):
            inp = httpclient.InferInput("INPUT0", [1, 6], "FP32")
            inp.set_data_from_numpy(data, binary_data=True)
            pending_requests.append(client.async_infer("preferred", [inp]))
        for req in pending_requests:
            np.testing.assert_array_equal(req.get_result().as_numpy("OUTPUT0"), data)
    finally:
        client.close()
    s = stats(server.base_url, "preferred")
    assert s["inference_count"] == 128
    assert s["inference_stats"]["success"]["count"] == 128
    assert s["execution_count"] <= 128 // 3, s["execution_count"]  # well below one execution per request
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    assert max(sizes) <= 8
    assert sum(size * n for size, n in sizes.items()) == 128
    assert sum(sizes.values()) == s["execution_count"]
    assert sizes.get(8, 0) >= 1, sizes  # the largest preferred size was reached
    # (how many requests each batch finds depends on how fast 32 clients come back; the backlog test
    # below builds the queue on purpose and checks that it leaves in preferred sizes only)


def test_backlog_leaves_in_preferred_batch_sizes(server: ServerProcess) -> None:
    """A 4 s request holds the single instance while 127 more queue: they leave in batches of 6, the largest
    preferred size, although max_batch_size (8) would allow more; only the tail may be smaller."""

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            url = "/v2/models/backlog/infer"
            blocker = asyncio.create_task(client.post(url, json=infer_body(sleep_ms=4000)))
            await asyncio.sleep(1.0)  # the blocker is executing now
            rest = [asyncio.create_task(client.post(url, json=infer_body())) for _ in range(127)]
            return await asyncio.gather(blocker, *rest)

    responses = asyncio.run(run())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:3]
    s = stats(server.base_url, "backlog")
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    assert sum(size * n for size, n in sizes.items()) == 128
    assert max(sizes) <= 8
    assert 7 not in sizes and 8 not in sizes, sizes  # a greedy batcher would send 8s
    # the blocker ran alone and the queue's tail (< 4 left) waits out the delay; everything else is 6 or 4
    odd = sum(n for size, n in sizes.items() if size not in (4, 6))
    assert sizes.get(6, 0) >= 18 and odd <= 3, sizes


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
    assert 1.9 <= seconds < 30, seconds  # max_queue_delay is 2 s; nothing else arrives to fill the batch


def test_full_batch_is_sent_without_waiting_for_the_delay(server: ServerProcess) -> None:
    start = time.monotonic()
    results = _flood(server, "delayed", 8)
    assert all(status == 200 for status, _, _ in results)
    assert [int(output(a, "BATCH")[0, 0]) for _, a, _ in results] == [8] * 8
    assert time.monotonic() - start < 1.9  # max_batch_size reached: no 2 s delay


def test_queue_full_rejects_the_excess(server: ServerProcess) -> None:
    results = _flood(server, "queue_limited", 8)
    ok = [r for r in results if r[0] == 200]
    rejected = [r for r in results if r[0] == 503]
    assert len(ok) + len(rejected) == 8, [r[:2] for r in results]
    assert len(ok) >= 3 and len(rejected) >= 1  # one executing + max_queue_size 2 queued
    for _, answer, _ in rejected:
        assert "maximum queue size" in answer["error"]
    s = stats(server.base_url, "queue_limited")
    assert s["inference_stats"]["fail"]["count"] == len(rejected)


def test_queue_full_is_unavailable_over_grpc(server: ServerProcess) -> None:
    fill = threading.Thread(target=_flood, args=(server, "queue_limited", 3))
    fill.start()
    try:
        wait_for("2 queued requests", lambda: pending(server.metrics_url, "queue_limited") >= 2)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 2), np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("queue_limited", [inp])
        assert "UNAVAILABLE" in str(info.value.status()) and "maximum queue size" in info.value.message()
        client.close()
    finally:
        fill.join()


def test_timeout_reject(server: ServerProcess) -> None:
    """One request executes 1.5 s; the queued ones time out after 0.3 s and are rejected."""
    bodies = [infer_body(), infer_body(), infer_body(timeout=10_000_000)]  # a request cannot raise its timeout
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post_infer, server.base_url, "timeout_reject", bodies[0])
        time.sleep(0.3)  # the first request is executing (1.5 s)
        rest = [pool.submit(post_infer, server.base_url, "timeout_reject", b) for b in bodies[1:]]
        status, answer, _ = first.result()
        assert status == 200, answer
        for f in rest:
            status, answer, _ = f.result()
            assert status == 503, answer
            assert "timeout" in answer["error"].lower()
    # a request's own shorter timeout is honoured too
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(post_infer, server.base_url, "timeout_reject", infer_body())
        time.sleep(0.3)
        status, answer, _ = post_infer(server.base_url, "timeout_reject", infer_body(timeout=50_000))
        assert status == 503 and "timeout" in answer["error"].lower()
        assert busy.result()[0] == 200


def test_timeout_delay_moves_expired_requests_behind(server: ServerProcess) -> None:
    """B's own 100 ms timeout expires while A runs: B is delayed behind C, which came later, but still runs."""
    done: dict[str, float] = {}

    def send(name: str, **params: object) -> int:
        status, answer, _ = post_infer(server.base_url, "timeout_delay", infer_body(**params))
        done[name] = time.monotonic()
        assert status == 200, answer
        return status

    with ThreadPoolExecutor(3) as pool:
        a = pool.submit(send, "A")
        time.sleep(0.3)  # A is executing (1.5 s)
        b = pool.submit(send, "B", timeout=100_000)
        wait_for("1 queued request", lambda: pending(server.metrics_url, "timeout_delay") >= 1)
        time.sleep(0.3)  # B's timeout has expired
        c = pool.submit(send, "C")
        for f in (a, b, c):
            assert f.result() == 200
    assert done["A"] < done["C"] < done["B"], done


def test_priority_overtakes_the_backlog(server: ServerProcess) -> None:
    done: dict[str, float] = {}

    def send(name: str, **params: object) -> None:
        status, answer, _ = post_infer(server.base_url, "prioritized", infer_body(**params))
        assert status == 200, answer
        done[name] = time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        low = [pool.submit(send, f"low{i}") for i in range(6)]
        wait_for("4 queued requests", lambda: pending(server.metrics_url, "prioritized") >= 4)
        high = pool.submit(send, "high", priority=1)
        for f in [*low, high]:
            f.result()
    later = [n for n, t in done.items() if n.startswith("low") and t > done["high"]]
    assert len(later) >= 3, done  # it jumped the queued low-priority requests


def test_priority_outside_the_levels_is_a_client_error(server: ServerProcess) -> None:
    status, answer, _ = post_infer(server.base_url, "prioritized", infer_body(priority=3))
    assert status == 400
    assert "priority 3" in answer["error"]


@pytest.mark.parametrize(("model", "ordered"), [("ordered", True), ("unordered", False)])
def test_preserve_ordering(server: ServerProcess, model: str, ordered: bool) -> None:
    """A slow request then a fast one on two instances: with preserve_ordering the fast one waits."""
    with ThreadPoolExecutor(2) as pool:
        start = time.monotonic()
        slow = pool.submit(post_infer, server.base_url, model, infer_body(sleep_ms=2000))
        time.sleep(0.3)
        fast = pool.submit(post_infer, server.base_url, model, infer_body(sleep_ms=10))
        fast_status, _, _ = fast.result()
        fast_done = time.monotonic() - start
        assert slow.result()[0] == 200 and fast_status == 200
    if ordered:
        assert fast_done >= 1.9
    else:
        assert fast_done < 1.9
