"""The server's start time (the start-up timeline's ``started_at``) is the process's own, to the clock tick."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kubeinfer.server.observability.system import process_start_time

#: /proc counts a process's start in clock ticks (100 per second on Linux)
TICK = 0.01


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the start time is read from Linux's /proc")
def test_a_new_process_started_between_the_clocks_read_around_its_start() -> None:
    for _ in range(5):  # /proc/stat's btime, whole seconds, was up to a second early: a few tries would show it
        before = time.time()
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "from kubeinfer.server.observability.system import process_start_time as p; print(p())",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        after = time.time()
        assert before - TICK <= float(out) <= after, (before, out, after)


def test_this_process_started_before_now() -> None:
    started = process_start_time()
    assert started is not None and started <= time.time()
