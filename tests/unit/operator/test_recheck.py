"""The rechecker calls back at growing delays until the model is done, one series per model."""

from __future__ import annotations

import threading
import time

from kubeinfer.operator.models.recheck import Rechecker


def test_series_until_done_and_restarts_on_reschedule():
    calls: dict[str, int] = {}
    done = {"a": threading.Event(), "b": threading.Event()}

    def check(key) -> bool:
        calls[key] = calls.get(key, 0) + 1
        if key == "a" and calls[key] == 3:
            done["a"].set()
            return True
        if key == "b" and calls[key] == 4:  # the series ends after its last delay
            done["b"].set()
        return False

    r = Rechecker(check, delays=(0.01, 0.01, 0.02, 0.02))
    r.start()
    try:
        r.schedule("a")
        r.schedule("b")
        r.schedule("b")  # a second schedule replaces the first: still one series
        assert done["a"].wait(10) and done["b"].wait(10)
        assert calls["a"] == 3
        for _ in range(50):
            if r.pending() == 0:
                break
            threading.Event().wait(0.02)
        assert r.pending() == 0 and calls["b"] == 4
    finally:
        r.stop()


def test_a_check_due_sooner_than_the_rest_is_not_held_behind_them():
    """Waiting threads are woken only for a check due before every other; with all of them waiting for
    later checks (a bulk apply's), one due now still runs at once, and the later ones at their time."""
    ran: dict[str, float] = {}
    now_done, later_done = threading.Event(), threading.Event()

    def check(key) -> bool:
        ran[key] = time.monotonic()
        (now_done if key == "now" else later_done).set()
        return True

    r = Rechecker(check, threads=3)
    r.start()
    try:
        start = time.monotonic()
        for i in range(200):
            r.schedule(f"later-{i}", delay=1.0 + i / 1000)
        r.schedule("now", delay=0.0)
        assert now_done.wait(5)
        assert ran["now"] - start < 0.5
        assert later_done.wait(5)
        for _ in range(100):
            if r.pending() == 0:
                break
            time.sleep(0.05)
        assert r.pending() == 0 and len(ran) == 201
        assert min(t for k, t in ran.items() if k != "now") - start >= 1.0
    finally:
        r.stop()
