"""One way to wait in tests: poll an observable condition, fail with what was last seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    what: str,
    predicate: Callable[[], T],
    timeout: float = 60,
    interval: float = 0.1,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; on timeout fail the test
    with ``what`` and the last observation (or ``describe()``, to say what the system looked like)."""
    deadline = time.monotonic() + timeout
    last = predicate()
    while not last:
        if time.monotonic() >= deadline:
            seen = describe() if describe is not None else last
            pytest.fail(f"timed out after {timeout}s waiting for {what}; last observation: {seen!r}")
        time.sleep(interval)
        last = predicate()
    return last


def wait_for_cluster(
    what: str,
    predicate: Callable[[], T],
    timeout: float = 60,
    interval: float = 0.5,
    describe: Callable[[], object] | None = None,
) -> T:
    """``wait_for`` at the pace of a control plane (every check is a kubectl call or an API request)."""
    return wait_for(what, predicate, timeout, interval, describe)
