"""Follow-up checks of a model soon after it was rendered, instead of waiting for the resync timer.

After a render the server needs one poll interval plus the load time to pick the change up; the
resync timer (30 s by default) would report Ready that much later. The rechecker calls back at
growing delays (1, 1, 2, 2, 4, 4, 8 s: ~22 s in all) until the callback says it is done (Ready,
failed for good, or gone); then the regular resync takes over. One thread serves every model.
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
log = logging.getLogger("kubeinfer.operator.recheck")


class Rechecker:
    def __init__(self, check: Callable[[Hashable], bool], delays: tuple[float, ...] = DELAYS) -> None:
        self.check = check
        self.delays = delays
        self._heap: list[tuple[float, int, Hashable, int]] = []
        #: key -> (sequence number of its live heap entry, context it runs in)
        self._due: dict[Hashable, tuple[int, contextvars.Context]] = {}
        self._seq = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def schedule(self, key: Hashable, attempt: int = 0, context: contextvars.Context | None = None) -> None:
        """Check ``key`` after the attempt's delay; a new schedule restarts the series."""
        if attempt >= len(self.delays):
            return
        when = time.monotonic() + self.delays[attempt]
        ctx = context or contextvars.copy_context()
        with self._cond:
            self._seq += 1
            self._due[key] = (self._seq, ctx)
            heapq.heappush(self._heap, (when, self._seq, key, attempt))
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="recheck")
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and wait for a check in progress (a daemon thread still running native code while the
        interpreter exits can abort the process)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

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
                done = ctx.run(self.check, key)
            except Exception as exc:  # the resync timer will try again anyway
                log.info("recheck of %s failed: %s", key, exc)
                done = False
            if not done:
                with self._cond:
                    rescheduled = key in self._due
                if not rescheduled:
                    self.schedule(key, attempt + 1, ctx)
