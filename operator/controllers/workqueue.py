"""Keys to work on, by a pool of threads: each key at most once at a time, at the earliest time it was asked for.

The InferenceModel reconciles run here rather than in kopf's change handlers: kopf's handlers persist
their progress and a diff base on every object (two extra patches, and the watch events they cause, per
model), where a key in this queue costs a dict entry. Adding a key that is already waiting only moves it
earlier; a key added while it runs runs again afterwards, with whatever its owner looks up then (the
newest object), so a burst of changes to one object costs one more run, not one per change.
``work`` returns a delay to run the key again later (a retry), or None.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger("kubeinfer.operator.controllers.workqueue")


class WorkQueue:
    def __init__(self, work: Callable[[Hashable], float | None], threads: int, name: str = "work") -> None:
        self.work = work
        self.threads = threads
        self.name = name
        self._heap: list[tuple[float, int, Hashable]] = []
        #: key -> when it is due (its live heap entry has exactly this time)
        self._due: dict[Hashable, float] = {}
        self._running: set[Hashable] = set()
        #: keys that came due while running: (due, key), pushed back when their run ends
        self._parked: dict[Hashable, float] = {}
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stop = False
        self._workers: list[threading.Thread] = []

    def add(self, key: Hashable, delay: float = 0.0) -> None:
        """Run ``key`` in ``delay`` seconds (or earlier, if it is already due earlier)."""
        when = time.monotonic() + delay
        with self._cond:
            if self._stop:
                return
            due = self._due.get(key, self._parked.get(key))
            if due is not None and due <= when:
                return
            if key in self._running or key in self._parked:
                self._parked[key] = when
                return
            self._due[key] = when
            heapq.heappush(self._heap, (when, next(self._seq), key))
            self._cond.notify()

    def discard(self, key: Hashable) -> None:
        """Forget a waiting key (a run in progress finishes)."""
        with self._cond:
            self._due.pop(key, None)
            self._parked.pop(key, None)

    def pending(self) -> int:
        with self._cond:
            return len(self._due) + len(self._parked) + len(self._running)

    def start(self) -> None:
        for i in range(self.threads):
            thread = threading.Thread(target=self._loop, daemon=True, name=f"{self.name}-{i}")
            self._workers.append(thread)
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking keys and wait for the runs in progress (up to ``timeout`` in all)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._workers:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> Hashable | None:
        with self._cond:
            while not self._stop:
                if not self._heap:
                    self._cond.wait()
                    continue
                when, _, key = self._heap[0]
                if self._due.get(key) != when:
                    heapq.heappop(self._heap)  # moved earlier, or discarded
                    continue
                wait = when - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                del self._due[key]
                self._running.add(key)
                return key
            return None

    def _loop(self) -> None:
        while (key := self._next()) is not None:
            again: float | None = None
            try:
                again = self.work(key)
            except Exception:  # the owner logs what it knows; a run never kills its thread
                log.exception("%s of %s failed", self.name, key)
            with self._cond:
                self._running.discard(key)
                parked = self._parked.pop(key, None)
                if parked is not None:
                    self._due[key] = parked
                    heapq.heappush(self._heap, (parked, next(self._seq), key))
                    self._cond.notify()
            if again is not None:
                self.add(key, again)
