"""The dynamic batcher's queue: priority levels, each with Triton's queue policy.

Order of service: level 1 (highest) first; inside a level, requests in arrival order, then the level's
requests whose timeout expired under ``timeout_action: DELAY``. ``max_queue_size`` counts one level's
requests; ``default_timeout_microseconds`` starts when a request is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import pb
from ..vocabulary.errors import InvalidArgument, QueueRejected
from ..vocabulary.types import InferenceRequest

#: (input name, dtype, shape without the batch dim) of every input, sorted
ShapeKey = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]


@dataclass(slots=True)
class Entry:
    """One queued request and the future its submitter awaits."""

    request: InferenceRequest
    future: asyncio.Future[dict[str, np.ndarray] | None]
    rows: int
    #: non-batch shapes and dtypes of every input: requests batch together only with equal keys
    key: ShapeKey
    enqueued_ns: int
    #: monotonic ns when the queue policy's timeout expires; 0 = never
    deadline_ns: int = 0
    #: arrival number, for preserve_ordering
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Policy:
    timeout_ns: int = 0
    delay_on_timeout: bool = False
    allow_override: bool = False
    max_size: int = 0

    @classmethod
    def from_config(cls, qp: pb.ModelQueuePolicy) -> Policy:
        return cls(
            timeout_ns=qp.default_timeout_microseconds * 1000,
            delay_on_timeout=qp.timeout_action == pb.ModelQueuePolicy.DELAY,
            allow_override=qp.allow_timeout_override,
            max_size=qp.max_queue_size,
        )

    def deadline(self, request: InferenceRequest, now_ns: int) -> int:
        """A request's ``timeout`` may only shorten the level's timeout (or set one where there is none)."""
        timeout = self.timeout_ns
        asked = request.timeout_us * 1000
        if self.allow_override and asked > 0 and (timeout == 0 or asked < timeout):
            timeout = asked
        return now_ns + timeout if timeout else 0


class _Level:
    __slots__ = ("policy", "queue", "delayed")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.queue: deque[Entry] = deque()
        self.delayed: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class PriorityQueue:
    def __init__(self, db: pb.ModelDynamicBatching) -> None:
        n = max(db.priority_levels, 1)
        default = Policy.from_config(db.default_queue_policy)
        self.levels = [
            _Level(Policy.from_config(db.priority_queue_policy[i]) if i in db.priority_queue_policy else default)
            for i in range(1, n + 1)
        ]
        self.priority_levels = db.priority_levels
        self.default_level = (db.default_priority_level or 1) if db.priority_levels else 1
        self._size = 0
        #: earliest timeout among queued requests (0 = none): expiry scans run only once it passed
        self.next_deadline_ns = 0

    def __len__(self) -> int:
        return self._size

    def level_of(self, request: InferenceRequest) -> int:
        """0-based level index for ``request.priority`` (0 → default; 1 = highest)."""
        p = request.priority
        if not self.priority_levels or p == 0:
            return self.default_level - 1
        if p > self.priority_levels:
            raise InvalidArgument(
                f"[request id: {request.id or '<id_unknown>'}] priority {p} is outside 1..{self.priority_levels} "
                f"(priority_levels of model '{request.model_name}'; 1 is the highest, 0 the default level)"
            )
        return p - 1

    def push(self, entry: Entry, level: int) -> None:
        lv = self.levels[level]
        if lv.policy.max_size and len(lv) >= lv.policy.max_size:
            raise QueueRejected(
                f"Exceeds maximum queue size: model '{entry.request.model_name}' already queues "
                f"{len(lv)} requests at this priority level (max_queue_size {lv.policy.max_size})"
            )
        entry.deadline_ns = lv.policy.deadline(entry.request, entry.enqueued_ns)
        if entry.deadline_ns and (not self.next_deadline_ns or entry.deadline_ns < self.next_deadline_ns):
            self.next_deadline_ns = entry.deadline_ns
        lv.queue.append(entry)
        self._size += 1

    def expire(self, now_ns: int) -> list[Entry]:
        """Apply timeouts: returns the rejected entries (removed); DELAY entries move behind their level."""
        if not self.next_deadline_ns or now_ns < self.next_deadline_ns:
            return []
        rejected: list[Entry] = []
        nearest = 0
        for lv in self.levels:
            if not any(e.deadline_ns for e in lv.queue):
                continue
            keep: deque[Entry] = deque()
            for e in lv.queue:
                if e.deadline_ns and e.deadline_ns <= now_ns:
                    if lv.policy.delay_on_timeout:
                        e.deadline_ns = 0
                        lv.delayed.append(e)
                    else:
                        rejected.append(e)
                        self._size -= 1
                    continue
                if e.deadline_ns and (not nearest or e.deadline_ns < nearest):
                    nearest = e.deadline_ns
                keep.append(e)
            lv.queue = keep
        self.next_deadline_ns = nearest
        return rejected

    def __iter__(self) -> Iterator[Entry]:
        """Entries in service order."""
        for lv in self.levels:
            yield from lv.queue
            yield from lv.delayed

    def oldest_ns(self) -> int:
        """Enqueue time of the oldest queued request (the one max_queue_delay is measured from)."""
        oldest = 0
        for lv in self.levels:
            for q in (lv.queue, lv.delayed):
                if q and (not oldest or q[0].enqueued_ns < oldest):
                    oldest = q[0].enqueued_ns
        return oldest

    def pop(self, n: int) -> list[Entry]:
        """Remove the first ``n`` entries in service order."""
        out: list[Entry] = []
        for lv in self.levels:
            for q in (lv.queue, lv.delayed):
                while q and len(out) < n:
                    out.append(q.popleft())
            if len(out) == n:
                break
        self._size -= len(out)
        return out

    def remove_done(self) -> list[Entry]:
        """Remove entries whose submitter stopped waiting (client disconnected, cancelled)."""
        removed: list[Entry] = []
        for lv in self.levels:
            for name in ("queue", "delayed"):
                q: deque[Entry] = getattr(lv, name)
                if any(e.future.done() for e in q):
                    removed += [e for e in q if e.future.done()]
                    setattr(lv, name, deque(e for e in q if not e.future.done()))
        self._size -= len(removed)
        return removed
