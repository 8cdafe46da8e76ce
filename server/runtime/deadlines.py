"""The server's request timeout (``--request-timeout``), one timer for all requests in flight.

A timer per request (``loop.call_later`` and ``cancel``) is a visible share of a short request's CPU (a
TimerHandle, heap pushes, cancelled handles swept from the loop's heap, and the running-loop lookups;
README 'Performance against Triton and MLServer'). Here a request costs a small record in a set; one
timer waits for the earliest deadline in flight, and when it fires it cancels whatever is past its
deadline and waits for the next one. With one timeout for the whole server the earliest deadline is the
oldest request's, so the timer fires about once per timeout period while requests keep coming and
finishing.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Deadline:
    """One request's deadline: ``expired`` once the timer cancelled ``task`` for it."""

    __slots__ = ("task", "when", "expired")

    def __init__(self, task: asyncio.Task[Any], when: float) -> None:
        self.task = task
        self.when = when
        self.expired = False


class RequestDeadlines:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[Deadline] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    @property
    def in_flight(self) -> int:
        """Requests started and neither finished nor expired."""
        return len(self._pending)

    def start(self, timeout: float) -> Deadline | None:
        """Cancel the running task in ``timeout`` seconds unless ``finish`` comes first; None outside a task."""
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:  # the first request, or one on another loop than before (tests run several)
            task = asyncio.current_task()
            if task is None:
                return None
            self._use(task.get_loop())
        assert self._loop is not None
        deadline = Deadline(task, self._loop.time() + timeout)
        self._pending.add(deadline)
        if self._timer is None or deadline.when < self._timer_at:
            self._arm(deadline.when)
        return deadline

    def finish(self, deadline: Deadline) -> None:
        """The request is answered: its deadline no longer applies (the timer may still fire, and finds it gone)."""
        self._pending.discard(deadline)

    def _use(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()  # requests of a loop that is gone
        self._loop = loop

    def _arm(self, when: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._expire)
        self._timer_at = when

    def _expire(self) -> None:
        """Cancel every request past its deadline; wait for the nearest of the others."""
        assert self._loop is not None
        self._timer = None
        now = self._loop.time()
        nearest = 0.0
        for deadline in list(self._pending):
            if deadline.when <= now:
                self._pending.discard(deadline)
                deadline.expired = True
                deadline.task.cancel()
            elif not nearest or deadline.when < nearest:
                nearest = deadline.when
        if nearest:
            self._arm(nearest)
