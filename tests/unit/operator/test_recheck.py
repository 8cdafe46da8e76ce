"""The rechecker calls back at growing delays until the model is done, one series per model."""

from __future__ import annotations

import threading

from kubeinfer.operator.recheck import Rechecker


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
