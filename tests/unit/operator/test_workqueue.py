"""The operator's work queue: a key runs at most once at a time, a burst of adds is one more run, delays."""

from __future__ import annotations

import threading
import time
from collections import Counter

from kubeinfer.operator.controllers.workqueue import WorkQueue


def test_a_key_never_runs_twice_at_once_and_a_burst_while_it_runs_is_one_more_run() -> None:
    runs: Counter[str] = Counter()
    running: set[str] = set()
    overlaps: list[str] = []
    release = threading.Event()

    def work(key: object) -> None:
        k = str(key)
        if k in running:
            overlaps.append(k)
        running.add(k)
        runs[k] += 1
        if k == "slow" and runs[k] == 1:
            release.wait(10)
        running.discard(k)

    q = WorkQueue(work, threads=4)
    q.start()
    try:
        q.add("slow")
        deadline = time.monotonic() + 10
        while runs["slow"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(50):  # changes while it runs: one more run afterwards, with whatever is newest then
            q.add("slow")
        for i in range(20):
            q.add(f"k{i}")
        deadline = time.monotonic() + 10
        while sum(runs[f"k{i}"] for i in range(20)) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(runs[f"k{i}"] == 1 for i in range(20))  # the others were not held up by the slow one
        release.set()
        deadline = time.monotonic() + 10
        while q.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runs["slow"] == 2 and not overlaps
    finally:
        q.stop()


def test_delays_retries_and_discards() -> None:
    seen: list[tuple[str, float]] = []
    t0 = time.monotonic()

    def work(key: object) -> float | None:
        seen.append((str(key), time.monotonic() - t0))
        return 0.2 if key == "retry" and len([k for k, _ in seen if k == "retry"]) < 3 else None

    q = WorkQueue(work, threads=2)
    q.start()
    try:
        q.add("later", delay=0.5)
        q.add("later", delay=5)  # a later time does not postpone it
        q.add("gone", delay=0.3)
        q.discard("gone")
        q.add("retry")
        time.sleep(1.2)
    finally:
        q.stop()
    keys = [k for k, _ in seen]
    assert keys.count("retry") == 3 and keys.count("later") == 1 and "gone" not in keys
    later = next(at for k, at in seen if k == "later")
    assert 0.45 <= later < 1.2
    retries = [at for k, at in seen if k == "retry"]
    assert all(b - a >= 0.19 for a, b in zip(retries, retries[1:], strict=False))
