"""Follow-up checks of a model soon after it was rendered, instead of waiting for the resync timer.

After a render the server needs one poll interval plus the load time to pick the change up; the
resync timer (30 s by default) would report Ready that much later. The rechecker calls back at
growing delays (1, 1, 2, 2, 4, 4, 8 s: ~22 s in all) until the callback says it is done (Ready,
failed for good, or gone); then the regular resync takes over. A few threads serve every model (a
check that changed something writes a status: a round trip to the API server).
Each check runs in the context of the handler that scheduled it: kopf's event posting lives in
context variables that only its per-object tasks set.
"""

from __future__ import annotations

import contextvars
import heapq
import logging
import threading
import time
from collections.abc import Callable, Hashable

DELAYS = (1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0)
log = logging.getLogger("kubeinfer.operator.models.recheck")


class Rechecker:
    def __init__(self, check: Callable[[Hashable], bool], delays: tuple[float, ...] = DELAYS, threads: int = 1) -> None:
        self.check = check
        self.delays = delays
        #: checks that run at once (each may write a status: a round trip to the API server)
        self.threads = threads
        self._heap: list[tuple[float, int, Hashable, int]] = []
        #: key -> (sequence number of its live heap entry, context it runs in)
        self._due: dict[Hashable, tuple[int, contextvars.Context]] = {}
        self._seq = 0
        self._cond = threading.Condition()
        self._stop = False
        self._threads: list[threading.Thread] = []

    def schedule(
        self, key: Hashable, attempt: int = 0, context: contextvars.Context | None = None, delay: float | None = None
    ) -> None:
        """Check ``key`` after the attempt's delay (or ``delay``); a new schedule restarts the series."""
        if attempt >= len(self.delays):
            return
        when = time.monotonic() + (self.delays[attempt] if delay is None else delay)
        ctx = context or contextvars.copy_context()
        with self._cond:
            self._seq += 1
            self._due[key] = (self._seq, ctx)
            heapq.heappush(self._heap, (when, self._seq, key, attempt))
            if self._heap[0][1] == self._seq:
                # due before everything else: a waiting thread must wait less (the others' waits already end
                # by the earliest check, so a later one wakes nobody: a bulk apply schedules thousands)
                self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._loop, daemon=True, name=f"recheck-{i}") for i in range(self.threads)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and wait for the checks in progress (a daemon thread still running native code while the
        interpreter exits can abort the process)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> tuple[Hashable, int, contextvars.Context] | None:
        with self._cond:
            while not self._stop:
                if self._heap:
                    when, seq, key, attempt = self._heap[0]
                    live = self._due.get(key)
                    if live is None or live[0] != seq:
                        heapq.heappop(self._heap)  # superseded by a later schedule
                        continue
                    wait = when - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self._heap)
                        del self._due[key]
                        return key, attempt, live[1]
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _loop(self) -> None:
        while (item := self._next()) is not None:
            key, attempt, ctx = item
            try:
                done = ctx.copy().run(self.check, key)  # a context is entered by one thread at a time
            except Exception as exc:  # the resync timer will try again anyway
                log.info("recheck of %s failed: %s", key, exc)
                done = False
            if not done:
                with self._cond:
                    rescheduled = key in self._due
                if not rescheduled:
                    self.schedule(key, attempt + 1, ctx)
