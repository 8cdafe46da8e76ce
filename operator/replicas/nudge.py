"""Telling poll-mode servers which model folders just changed, instead of waiting for their next poll.

A server in poll mode notices a new, changed or removed model folder at its next poll (5 s by default),
then loads the models one after another; at 1,000 models that is most of the time from "rendered" to
"Ready". The operator knows which folders it wrote or removed, so it asks each replica to look at those
now: ``POST /v2/repository/poll`` with their names (kubeinfer's extension; the server does what its next
poll would do for them, ``--model-load-thread-count`` at a time, and answers with their index rows).

Names are batched per replica: while one request is in flight, the names that come in wait and go
together in the next one, and two requests to a replica are at least ``LINGER`` apart (the first goes at
once) unless ``full`` names wait. A bulk apply reaches the operator one model at a time, a few dozen a
second (``kubectl apply`` sends one request per object): without the pause most requests would carry one
name, a round trip per model for the operator and the server; with it a bulk apply costs a few requests
a second. A bulk delete does not wait for it: each deletion holds a reconcile thread until its answer
comes, so once every thread waits (``full``, the operator's ``--workers``) the request goes at once. A
replica that does not take the request (an older server, explicit or none mode: 404 or 503) is not
asked again for a while; the operator then waits for its poll (and its rechecks see the result).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .indexes import INDEX_MAX_BYTES
from .replica_http import AnswerError, ReplicaClient
from .server_access import ServerAccess

#: names one request carries at most (each is one load or unload on the server)
MAX_BATCH = 200
#: seconds a replica that refused the request is not asked again
UNSUPPORTED_FOR = 300.0
#: seconds between the starts of two requests to one replica (names that come meanwhile go together)
LINGER = 0.25
#: names waiting for one replica that go without the pause (the reconcile threads: see the docstring)
FULL = 8
#: replicas remembered beyond which the idle ones are forgotten
PRUNE_ABOVE = 256
log = logging.getLogger("kubeinfer.operator.replicas.nudge")

Rows = list[dict[str, Any]]


class Ticket:
    """The outcome of one name's nudge: its rows on the replica once polled, None when the request failed."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.rows: Rows | None = None

    def finish(self, rows: Rows | None) -> None:
        self.rows = rows
        self._done.set()

    def wait(self, timeout: float) -> Rows | None:
        return self.rows if self._done.wait(timeout) else None


@dataclass
class _Replica:
    url: str
    access: ServerAccess
    pending: dict[str, list[Ticket]] = field(default_factory=dict)
    busy: bool = False
    refused_until: float = 0.0
    #: when the last request to it went out (monotonic seconds)
    sent: float = -1e18


class Nudger:
    """``client(access)``: the HTTP client for a pool's access; ``done(url, access, names, rows)``: called after
    each request with the names it asked about and their rows (None: no answer), to recheck those models."""

    def __init__(
        self,
        client: Callable[[ServerAccess], ReplicaClient],
        done: Callable[[str, ServerAccess, list[str], dict[str, Rows] | None], None] | None = None,
        timeout: float = 60.0,
        threads: int = 4,
        max_bytes: int = INDEX_MAX_BYTES,
        linger: float = LINGER,
        full: int = FULL,
    ) -> None:
        self.client = client
        self.done = done
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.linger = linger
        self.full = full
        self._replicas: dict[str, _Replica] = {}
        self._guard = threading.Lock()
        self._wake = threading.Condition(self._guard)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="nudge")
        self._closed = False
        self.requests = 0  # for the benchmark

    def nudge(self, url: str, access: ServerAccess, names: Iterable[str]) -> list[Ticket]:
        """Ask the replica at ``url`` (plain http URL; ``access`` says how to call it) to poll ``names`` now."""
        tickets = []
        with self._guard:
            if self._closed:
                return []
            replica = self._replicas.get(url)
            if replica is None:
                if len(self._replicas) > PRUNE_ABOVE:  # pods come and go, and so do their addresses
                    for old in [u for u, r in self._replicas.items() if not r.busy and not r.pending]:
                        del self._replicas[old]
                replica = self._replicas[url] = _Replica(url, access)
            replica.access = access
            refused = time.monotonic() < replica.refused_until
            for name in names:
                ticket = Ticket()
                tickets.append(ticket)
                if refused:
                    ticket.finish(None)
                else:
                    replica.pending.setdefault(name, []).append(ticket)
            start = bool(replica.pending) and not replica.busy
            if start:
                replica.busy = True
            elif len(replica.pending) >= self.full:
                self._wake.notify_all()
        if start:
            self._pool.submit(self._send, replica)
        return tickets

    def _send(self, replica: _Replica) -> None:
        while True:
            with self._guard:
                if not replica.pending or self._closed:
                    replica.busy = False
                    for tickets in replica.pending.values():
                        for ticket in tickets:
                            ticket.finish(None)
                    replica.pending.clear()
                    return
                wait = replica.sent + self.linger - time.monotonic()
                if wait > 0 and len(replica.pending) < self.full:
                    # more names may come meanwhile: they go in the same request (``nudge`` wakes it when full)
                    self._wake.wait(wait)
                    continue
                names = list(replica.pending)[:MAX_BATCH]
                batch = {name: replica.pending.pop(name) for name in names}
                access = replica.access
                replica.sent = time.monotonic()
            rows = self._post(replica, access, names)
            by_name: dict[str, Rows] = {name: [] for name in names}
            for row in rows or ():
                row_name = row.get("name")
                if isinstance(row_name, str) and row_name in by_name:
                    by_name[row_name].append(row)
            for name, tickets in batch.items():
                for ticket in tickets:
                    ticket.finish(None if rows is None else by_name[name])
            if self.done is not None:
                try:
                    self.done(replica.url, access, names, None if rows is None else by_name)
                except Exception:
                    log.exception("after the poll request to %s", replica.url)

    def _post(self, replica: _Replica, access: ServerAccess, names: list[str]) -> Rows | None:
        self.requests += 1
        try:
            # the answer comes once the replica has loaded the models: ``timeout`` bounds the whole exchange
            answer = self.client(access).exchange(
                "POST",
                f"{access.url(replica.url)}/v2/repository/poll",
                json_body={"models": names},
                headers=access.headers,
                max_bytes=self.max_bytes,
                deadline=self.timeout,
                timeout=self.timeout,
            )
        except AnswerError as exc:
            log.info("poll request to %s failed (%s): the server's own poll will pick the changes up", replica.url, exc)
            return None
        if answer.status in (404, 405, 503):
            with self._guard:
                replica.refused_until = time.monotonic() + UNSUPPORTED_FOR
            log.info(
                "%s does not take poll requests (HTTP %s): waiting for its own poll instead",
                replica.url,
                answer.status,
            )
            return None
        try:
            if not 200 <= answer.status < 300:
                raise ValueError(f"HTTP {answer.status}")
            data = answer.json()
        except ValueError as exc:
            log.info("poll request to %s failed: %s", replica.url, exc)
            return None
        return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else None

    def close(self) -> None:
        with self._guard:
            self._closed = True
            self._wake.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
