"""Triton's rate limiter (``--rate-limit=execution_count``): an instance executes only with its resources.

Each model instance names resources in its group's ``rate_limiter { resources [...] priority }``. A resource
is per device (the instance's device id; CPU instances are device 0) unless ``global: true``, then one copy
serves the whole server. How many copies exist: ``--rate-limit-resource=<name>:<count>[:<device>]`` when any
is given (a resource no flag names then has 0), otherwise the largest count any loaded instance asks for.
Triton core ``src/rate_limiter.cc``: ``ResourceManager::UpdateResourceLimits``,
``ParseAndValidateExplicitResources`` and ``ValidateMaxResources`` (their error texts are kept).

An instance that has work asks for its resources (it is *staged*); staged instances are served in the order
of ``exec_count * max(priority, 1)`` (``ModelInstanceContext::ScaledPriority``), lowest first, and only the
first in that order is tried (``AttemptAllocation``): an instance of priority 2 runs half as often as one of
priority 1 when both wait. Resources are held for one execution and given back after it; the time waiting
for them counts as queue time, as in Triton (compute starts once the instance runs).

Everything runs on the server's event loop; no locks.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..vocabulary.errors import InvalidArgument

#: the device key of global resources, and of ``--rate-limit-resource`` entries without a device
GLOBAL = -2
PER_DEVICE = -1

_FORMAT = "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. Got "


def parse_resource(arg: str) -> tuple[str, int, int]:
    """``<name>:<count>[:<device>]`` → (name, count, device or ``PER_DEVICE``); Triton's parser's message."""
    parts = arg.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(_FORMAT + arg)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else PER_DEVICE
    except ValueError:
        raise ValueError(_FORMAT + arg) from None
    if count < 0:
        raise ValueError(_FORMAT + arg)
    return parts[0], count, device


#: {device key: {resource name: count}}
ResourceMap = dict[int, dict[str, int]]


@dataclass(eq=False)
class Ticket:
    """One model instance as the limiter sees it."""

    model: str
    #: {device key (device id or GLOBAL): {resource: count}}
    needs: ResourceMap
    priority: int = 1
    #: executions done (``exec_count_``): counted when the resources come back
    executions: int = 0
    staged: bool = False
    holding: bool = False
    on_grant: Callable[[], None] | None = field(default=None, repr=False)

    def scaled_priority(self) -> int:
        return self.executions * max(self.priority, 1)


class RateLimiter:
    def __init__(self, explicit: Iterable[tuple[str, int, int]] = ()) -> None:
        #: ``--rate-limit-resource`` entries: {device or PER_DEVICE: {name: count}}
        self.explicit: ResourceMap = {}
        for name, count, device in explicit:
            per = self.explicit.setdefault(device, {})
            per[name] = max(per.get(name, 0), count)
        self._tickets: list[Ticket] = []
        #: copies of each resource ({device key: {name: count}}), recomputed as instances come and go
        self.available: ResourceMap = {}
        self._allocated: ResourceMap = {}
        #: staged tickets: (scaled priority, arrival, ticket)
        self._staged: list[tuple[int, int, Ticket]] = []
        self._order = itertools.count()
        #: the loop allocations run on (the first ``register`` call's)
        self.loop: asyncio.AbstractEventLoop | None = None

    # ---- registration (load / unload) ----------------------------------------------------------------------
    def register(self, model: str, instances: Sequence[tuple[object, int]]) -> list[Ticket]:
        """Tickets for a model's instances, each given as (its group's ``rate_limiter`` message, device id);
        raises ``InvalidArgument`` with Triton's message when the resources cannot serve them all."""
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                pass
        tickets = []
        for config, device in instances:
            needs: ResourceMap = {}
            for res in getattr(config, "resources", ()):
                key = GLOBAL if getattr(res, "global") else device
                needs.setdefault(key, {})[res.name] = res.count
            tickets.append(Ticket(model, needs, int(getattr(config, "priority", 0) or 0)))
        before = self._tickets
        self._tickets = before + tickets
        try:
            self._update_limits()
        except InvalidArgument:
            self._tickets = before
            self._update_limits()
            raise
        return tickets

    def unregister(self, tickets: Iterable[Ticket]) -> None:
        gone = set(map(id, tickets))
        self._tickets = [t for t in self._tickets if id(t) not in gone]
        self._staged = [e for e in self._staged if id(e[2]) not in gone]
        heapq.heapify(self._staged)
        try:
            self._update_limits()
        except InvalidArgument:  # cannot happen with fewer instances; keep the previous counts
            pass
        self._allocate()

    def unregister_soon(self, tickets: list[Ticket]) -> None:
        """``unregister`` from any thread (a pool closes on a worker thread)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            self.unregister(tickets)
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop or threading.current_thread() is threading.main_thread() and not loop.is_running():
            self.unregister(tickets)
        else:
            loop.call_soon_threadsafe(self.unregister, tickets)

    def _update_limits(self) -> None:
        """``UpdateResourceLimits``: the largest count asked for, or the explicit counts (validated)."""
        limits: ResourceMap = {}
        for ticket in self._tickets:
            for key, per in ticket.needs.items():
                target = limits.setdefault(key, {})
                for name, count in per.items():
                    target[name] = max(target.get(name, 0), count)
        if self.explicit:
            for key, per in limits.items():
                for name, needed in per.items():
                    if key == GLOBAL:  # any entry of that name, whatever its device
                        given = max((p.get(name, 0) for p in self.explicit.values()), default=0)
                    else:
                        given = max(
                            self.explicit.get(key, {}).get(name, 0), self.explicit.get(PER_DEVICE, {}).get(name, 0)
                        )
                    if given < needed:
                        raise InvalidArgument(
                            f'Resource count for "{name}" is limited to {given} which will prevent scheduling of one '
                            f"or more model instances, the minimum required count is {needed}"
                        )
                    per[name] = given
        for name in limits.get(GLOBAL, {}):
            if any(name in per for key, per in limits.items() if key != GLOBAL):
                raise InvalidArgument(
                    f'Resource "{name}" is present as both global and device-specific resource in the model '
                    "configuration."
                )
        self.available = limits

    # ---- allocation -------------------------------------------------------------------------------------------
    def stage(self, ticket: Ticket, on_grant: Callable[[], None]) -> None:
        """``ticket``'s instance has work: ``on_grant()`` is called (maybe at once) when it holds its
        resources. A ticket is staged at most once at a time."""
        if ticket.staged or ticket.holding:
            return
        ticket.staged = True
        ticket.on_grant = on_grant
        heapq.heappush(self._staged, (ticket.scaled_priority(), next(self._order), ticket))
        self._allocate()

    def unstage(self, ticket: Ticket) -> None:
        if ticket.staged:
            ticket.staged = False
            self._staged = [e for e in self._staged if e[2] is not ticket]
            heapq.heapify(self._staged)
            self._allocate()

    def release(self, ticket: Ticket, executed: bool = True, restage: Callable[[], None] | None = None) -> None:
        """``ticket``'s execution ended: its resources come back. ``restage``, when the instance has more work,
        stages it again before the next allocation, as Triton's ``OnRelease`` does (so its priority competes
        with those already waiting)."""
        if not ticket.holding:
            return
        ticket.holding = False
        if executed:
            ticket.executions += 1
        for key, per in ticket.needs.items():
            allocated = self._allocated[key]
            for name, count in per.items():
                allocated[name] -= count
        if restage is not None:
            ticket.staged = True
            ticket.on_grant = restage
            heapq.heappush(self._staged, (ticket.scaled_priority(), next(self._order), ticket))
        self._allocate()

    def _fits(self, ticket: Ticket) -> bool:
        for key, per in ticket.needs.items():
            allocated = self._allocated.get(key, {})
            limit = self.available.get(key, {})
            for name, count in per.items():
                if allocated.get(name, 0) + count > limit.get(name, 0):
                    return False
        return True

    def _allocate(self) -> None:
        """``AttemptAllocation``: grant the first staged ticket while its resources are free."""
        while self._staged:
            _, _, ticket = self._staged[0]
            if not self._fits(ticket):
                return
            heapq.heappop(self._staged)
            ticket.staged = False
            ticket.holding = True
            for key, per in ticket.needs.items():
                allocated = self._allocated.setdefault(key, {})
                for name, count in per.items():
                    allocated[name] = allocated.get(name, 0) + count
            grant, ticket.on_grant = ticket.on_grant, None
            if grant is not None:
                grant()
