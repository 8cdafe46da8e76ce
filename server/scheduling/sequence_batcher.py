"""Triton's sequence batcher: stateful models, one batch slot per live sequence.

Semantics from Triton (docs/user_guide/architecture.md "Stateful Models",
docs/user_guide/implicit_state_management.md, core/src/sequence_batch_scheduler/):

* A request names its sequence with ``sequence_id`` (uint64 or string) and marks the first and last
  request with ``sequence_start`` / ``sequence_end``. Every request of a sequence goes to the same
  instance and the same *batch slot*; an instance has ``max(1, max_batch_size)`` slots (``oldest``:
  ``max_candidate_sequences``). A start without a free slot waits in a backlog; the backlog is served in
  arrival order as slots free up. A slot is freed when the sequence's END request has executed, or when
  the sequence sent nothing for ``max_sequence_idle_microseconds`` (default 1 s); a later request for a
  freed sequence is refused with Triton's "must specify the START flag" error.
* Requests of one sequence execute one at a time and in order; a batch holds at most one request per
  sequence, and each request is batch size 1.
* ``direct``: the batch row is the slot. Rows of slots with nothing ready (up to the highest slot used in
  this batch) are filled with zero requests whose READY control is false; they are computed but never
  answered or counted. ``max_queue_delay_microseconds`` with ``minimum_slot_utilization`` waits for more
  slots to have a request. ``oldest``: a dynamic batch of the oldest ready requests, one per sequence
  (``preferred_batch_size``, ``max_queue_delay_microseconds``); no filler rows.
* Control inputs the model declares in ``control_input`` are added to every request: START, END,
  READY (the ``*_false_true`` values of their data type) and CORRID (the correlation id as the declared
  UINT64/INT64/UINT32/INT32/STRING tensor). Shape ``[1]`` per request (``[1, 1]`` with batching).
* Implicit state (``state``): the output ``output_name`` of step *i* is the input ``input_name`` of step
  *i + 1* of the same sequence; a START request gets ``initial_state`` (zeros or ``initial_state/<data_file>``)
  or, without one, zeros with 1 for every variable dim. State outputs go back to the client only when the
  config also lists them as outputs and the client asks for them.

* Iterative sequences (``iterative_sequence: true``; Triton's ``IterativeSequencer``,
  core/src/sequence_batch_scheduler/sequence_utils.{h,cc}): a request without a correlation id is a
  sequence of its own (the batcher numbers it from 1 and marks it START). A model that releases a request
  with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (a Python model's ``request.set_release_flags``) gets
  the same request again, at the head of its slot's queue and with neither START nor END set; a request
  released otherwise ends its sequence, which frees the slot. Each execution may send responses through
  the request's response sender (decoupled models), the last with the final flag. Without
  ``iterative_sequence`` a rescheduled request is answered with the backend's error (Triton fails the
  release so).

Everything runs on the event loop; executions happen on the instance's thread (InstancePool).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import Batch, RequestResult, Rescheduled
from ..config import pb
from ..config.sequence import control_spec
from ..repository.model_files import ModelFolder
from ..vocabulary import datatypes
from ..vocabulary.errors import Cancelled, InternalError, InvalidArgument, Unavailable
from ..vocabulary.sequence import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START, Sequence, sequence_of
from ..vocabulary.types import InferenceRequest
from .base import Scheduler
from .instance_pool import InstancePool
from .results import answer

log = logging.getLogger(__name__)

#: Triton's default when max_sequence_idle_microseconds is 0 or unset (core/src/constants.h)
DEFAULT_IDLE_US = 1_000_000
Corrid = int | str


@dataclass
class _Entry:
    request: InferenceRequest
    future: asyncio.Future[Any]
    seq: Sequence
    arrived_ns: int


@dataclass
class _Slot:
    instance: int
    index: int
    corrid: Corrid | None = None
    queue: deque[_Entry] = field(default_factory=deque)
    #: implicit state: input name → the previous step's output, None before the first step
    state: dict[str, np.ndarray] | None = None
    last_ns: int = 0

    def order(self) -> tuple[int, int]:
        """Free slots are handed out lowest slot index first, across instances (Triton's slot heap)."""
        return (self.index, self.instance)


@dataclass
class _Backlog:
    corrid: Corrid
    entries: deque[_Entry] = field(default_factory=deque)
    ended: bool = False
    #: when the sequence's last request arrived (the idle rule's clock)
    last_ns: int = 0

    def abandoned(self) -> bool:
        """Every request's caller is gone (cancelled: the client disconnected or gave up): nobody waits."""
        return all(e.future.done() for e in self.entries)


@dataclass
class _Control:
    name: str
    kind: str
    dtype: np.dtype[Any]
    #: [false, true] for START/END/READY
    values: list[Any] = field(default_factory=list)


def _controls(config: pb.ModelConfig) -> list[_Control]:
    out = []
    for ci in config.sequence_batching.control_input:
        control = ci.control[0]
        kind = pb.ModelSequenceBatching.Control.Kind.Name(control.kind)
        if kind == "CONTROL_SEQUENCE_CORRID":
            type_name = pb.DataType.Name(control.data_type)
            values: list[Any] = []
        else:
            type_name, values = control_spec(control)
        numpy = datatypes.from_config(type_name).numpy
        out.append(_Control(ci.name, kind, np.dtype(object if numpy is None else numpy), values))
    return out


class SequenceBatcher(Scheduler):
    def __init__(self, pool: InstancePool, config: pb.ModelConfig, model_dir: ModelFolder | None = None) -> None:
        sb = config.sequence_batching
        self.pool = pool
        self.config = config
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        self.batching = config.max_batch_size > 0
        self.oldest = sb.HasField("oldest")
        slots = max(1, config.max_batch_size)
        if self.oldest and sb.oldest.max_candidate_sequences > 0:
            slots = sb.oldest.max_candidate_sequences
        self.slots_per_instance = slots
        self.max_rows = max(1, config.max_batch_size)
        strategy = sb.oldest if self.oldest else sb.direct
        self.delay_ns = strategy.max_queue_delay_microseconds * 1000
        self.min_utilization = 0.0 if self.oldest else sb.direct.minimum_slot_utilization
        self.preferred = sorted({p for p in sb.oldest.preferred_batch_size if p <= self.max_rows}, reverse=True)
        self.idle_ns = (sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000
        #: iterative sequences: requests may be rescheduled; one without a correlation id is its own sequence
        self.iterative = sb.iterative_sequence
        self._next_implicit = 1
        self.controls = _controls(config)
        self.corrid_control = next((c for c in self.controls if c.kind == "CONTROL_SEQUENCE_CORRID"), None)
        self.states = list(sb.state)
        self.initial = {st.input_name: self._initial_state(st, model_dir) for st in self.states}
        self.state_outputs = {st.output_name: st.input_name for st in self.states}
        self.config_outputs = [t.name for t in config.output]
        self.slots = [[_Slot(i, s) for s in range(slots)] for i in range(pool.size)]
        self.free: list[_Slot] = sorted((s for row in self.slots for s in row), key=_Slot.order)
        self.active: dict[Corrid, _Slot] = {}
        self.backlogs: deque[_Backlog] = deque()
        self.backlog_map: dict[Corrid, _Backlog] = {}
        self._wake: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._reaper: asyncio.Task[None] | None = None
        self._reaper_wake: asyncio.Event | None = None
        self._busy = [False] * pool.size
        self._closing = False
        self._idle: asyncio.Event | None = None

    def instance_pool(self) -> InstancePool:
        return self.pool

    # ---- initial state ------------------------------------------------------------------------
    def _initial_state(self, st: pb.ModelSequenceBatching.State, model_dir: ModelFolder | None) -> np.ndarray:
        type_name = pb.DataType.Name(st.data_type)
        dt = datatypes.from_config(type_name)
        lead = [1] if self.batching else []
        if not st.initial_state:
            shape = lead + [1 if d == -1 else int(d) for d in st.dims]
            return _zeros(shape, dt.numpy)
        init = st.initial_state[0]
        shape = lead + [int(d) for d in init.dims]
        if init.WhichOneof("state_data") == "zero_data":
            return _zeros(shape, dt.numpy)
        if model_dir is None:
            raise InvalidArgument(f"state '{st.input_name}': initial_state data_file needs the model folder")
        relative = f"initial_state/{init.data_file}"
        try:  # through the model folder's descriptor; a symlink leading out of the folder is refused
            data = model_dir.read(relative, f"state '{st.input_name}': initial_state data_file")
        except OSError as exc:
            raise InvalidArgument(
                f"state '{st.input_name}': cannot read initial_state file {relative}: {exc.strerror or exc}"
            ) from None
        if dt.numpy is None or dt.v2 == "BYTES":  # the file is one element
            out = np.empty(shape, dtype=object)
            out.reshape(-1)[:] = data
            return out
        need = int(np.prod(shape)) * dt.itemsize
        if len(data) < need:
            raise InvalidArgument(
                f"initial_state setting expects {need} bytes, but the data provided from {init.data_file}"
                f"only has {len(data)} bytes."
            )
        state: np.ndarray = np.frombuffer(data[:need], dtype=dt.numpy.newbyteorder("<")).reshape(shape).copy()
        return state

    # ---- Scheduler interface ----------------------------------------------------------------------
    @property
    def pending(self) -> int:
        queued = sum(len(s.queue) for row in self.slots for s in row)
        return queued + sum(len(b.entries) for b in self.backlogs)

    @property
    def holds_state(self) -> bool:
        return bool(self.active or self.backlogs)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        self._wake = [asyncio.Event() for _ in range(self.pool.size)]
        self._tasks = [
            loop.create_task(self._run_instance(i), name=f"sequence-{self.model}-{i}") for i in range(self.pool.size)
        ]
        self._reaper_wake = asyncio.Event()
        self._reaper = loop.create_task(self._reap(), name=f"sequence-reaper-{self.model}")

    async def submit(self, request: InferenceRequest) -> dict[str, np.ndarray] | None:
        if self._closing or self._idle is None:
            raise Unavailable(f"model '{request.model_name}' is unloading")
        seq = sequence_of(request.parameters)
        model = request.model_name
        if not seq and self.iterative:
            seq = self._implicit_sequence(request)
        if not seq:
            raise InvalidArgument(
                f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
            )
        if self.batching and request.batch_size(self.max_batch_size) > 1:
            raise InvalidArgument(
                f"inference request to model '{model}' must specify batch-size 1 due to requirements of "
                "sequence batcher"
            )
        corrid = self._corrid(seq, model)
        slot = self.active.get(corrid)
        backlog = self.backlog_map.get(corrid)
        if not seq.start and slot is None and backlog is None:
            raise InvalidArgument(
                f"inference request for sequence {corrid} to model '{model}' must specify the START flag on the "
                "first request of the sequence"
            )
        if seq.start and (slot is not None or backlog is not None):
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.",
                corrid,
                model,
            )
        now = time.monotonic_ns()
        request.queued_ns = now
        entry = _Entry(request, asyncio.get_running_loop().create_future(), seq, now)
        self._idle.clear()
        if slot is not None:
            slot.queue.append(entry)
            slot.last_ns = now
            if seq.end:
                del self.active[corrid]
            self._wake[slot.instance].set()
        elif backlog is not None:
            backlog.entries.append(entry)
            backlog.last_ns = now
            if seq.end:
                backlog.ended = True
                del self.backlog_map[corrid]
        elif self.free:
            slot = self.free.pop(0)
            slot.corrid = corrid
            slot.state = None
            slot.queue.append(entry)
            slot.last_ns = now
            if not seq.end:
                self.active[corrid] = slot
            self._wake[slot.instance].set()
        else:
            backlog = _Backlog(corrid, deque([entry]), ended=seq.end, last_ns=now)
            self.backlogs.append(backlog)
            if not seq.end:
                self.backlog_map[corrid] = backlog
        result: dict[str, np.ndarray] | None = await entry.future
        return result

    def _implicit_sequence(self, request: InferenceRequest) -> Sequence:
        """Triton's IterativeSequencer::SetupSequenceRequest: a request without a correlation id starts a
        sequence of its own, numbered from 1 (ids in use are skipped); the model sees its id and START flag."""
        while True:
            cid = self._next_implicit
            self._next_implicit += 1
            key: Corrid = (
                str(cid) if self.corrid_control is not None and self.corrid_control.dtype == np.dtype(object) else cid
            )
            if key not in self.active and key not in self.backlog_map:
                break
        request.parameters = {**request.parameters, SEQUENCE_ID: cid, SEQUENCE_START: True, SEQUENCE_END: False}
        return Sequence(cid, start=True)

    def _corrid(self, seq: Sequence, model: str) -> Corrid:
        cid = seq.correlation_id
        control = self.corrid_control
        if control is None:
            return cid
        if control.dtype == np.dtype(object):
            return cid if isinstance(cid, str) else str(cid)
        if isinstance(cid, str):
            raise InvalidArgument(
                f"inference request to model '{model}' must specify an unsigned integer correlation ID: its "
                f"CONTROL_SEQUENCE_CORRID input '{control.name}' is {datatypes.from_numpy(control.dtype).v2}"
            )
        info = np.iinfo(control.dtype)
        if cid > info.max:
            raise InvalidArgument(
                f"correlation ID {cid} for model '{model}' does not fit its CONTROL_SEQUENCE_CORRID input "
                f"'{control.name}' ({datatypes.from_numpy(control.dtype).v2})"
            )
        return cid

    async def close(self) -> None:
        """Stop once every queued request was executed and delivered."""
        self._closing = True
        if self._idle is None:
            return
        for wake in self._wake:
            wake.set()
        if self.pending or any(self._busy):
            await self._idle.wait()
        for task in [*self._tasks, *([self._reaper] if self._reaper else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._reaper] if self._reaper else []), return_exceptions=True)

    # ---- per-instance batching loop ----------------------------------------------------------------
    async def _run_instance(self, instance: int) -> None:
        wake = self._wake[instance]
        while True:
            await wake.wait()
            wake.clear()
            while True:
                chosen, wait_ns = self._choose(instance)
                if not chosen:
                    if wait_ns:
                        try:
                            await asyncio.wait_for(wake.wait(), wait_ns / 1e9)
                            wake.clear()
                        except asyncio.TimeoutError:
                            pass
                        continue
                    break
                self._busy[instance] = True
                try:
                    await self._execute(instance, chosen)
                finally:
                    self._busy[instance] = False
            self._check_idle()

    def _ready(self, instance: int) -> list[_Slot]:
        return [s for s in self.slots[instance] if s.queue]

    def _key(self, slot: _Slot) -> tuple[Any, ...]:
        """Requests batch together only with equal shapes, implicit state included."""
        entry = slot.queue[0]
        shapes = [(n, a.dtype.str, a.shape[1:]) for n, a in entry.request.inputs.items()]
        for st in self.states:
            value = None if entry.seq.start or slot.state is None else slot.state.get(st.input_name)
            if value is None:
                value = self.initial[st.input_name]
            shapes.append((st.input_name, value.dtype.str, value.shape[1:]))
        return tuple(sorted(shapes))

    def _choose(self, instance: int) -> tuple[list[_Slot | None], int]:
        """The slots whose head request runs now (None = a filler row), or ([], ns to wait, 0 = nothing)."""
        ready = self._ready(instance)
        if not ready:
            return [], 0
        now = time.monotonic_ns()
        due = min(s.queue[0].arrived_ns for s in ready) + self.delay_ns
        waiting = bool(self.delay_ns) and now < due and not self._closing
        if self.oldest:
            ready.sort(key=lambda s: s.queue[0].arrived_ns)
            key = self._key(ready[0])
            group = [s for s in ready if self._key(s) == key][: self.max_rows]
            if len(group) < self.max_rows:
                preferred = next((p for p in self.preferred if p <= len(group)), 0)
                if preferred:
                    group = group[:preferred]
                elif waiting:
                    return [], due - now
            return list(group), 0
        # direct: the row is the slot index; rows without a ready request are fillers
        if waiting and len(ready) / self.slots_per_instance < self.min_utilization:
            return [], due - now
        ready.sort(key=lambda s: s.index)
        key = self._key(ready[0])
        rows = {s.index: s for s in ready if self._key(s) == key}
        return [rows.get(i) for i in range(max(rows) + 1)], 0

    async def _execute(self, instance: int, chosen: list[_Slot | None]) -> None:
        entries: list[_Entry | None] = [s.queue.popleft() if s is not None else None for s in chosen]
        wanted: list[list[str] | None] = []
        template: InferenceRequest | None = None
        for slot, entry in zip(chosen, entries, strict=True):
            if slot is None or entry is None:
                wanted.append(None)
                continue
            request = entry.request
            wanted.append(request.requested_outputs)
            if entry.seq.start or slot.state is None:
                slot.state = {}
            self._add_controls(request, entry.seq, ready=True, corrid=slot.corrid)
            for st in self.states:
                value = None if entry.seq.start else slot.state.get(st.input_name)
                request.inputs[st.input_name] = value if value is not None else self.initial[st.input_name]
            if self.state_outputs and request.requested_outputs is not None:
                missing = [n for n in self.state_outputs if n not in request.requested_outputs]
                request.requested_outputs = [*request.requested_outputs, *missing]
            template = template or request
        assert template is not None
        requests: list[InferenceRequest] = []
        fillers: set[int] = set()
        for row, entry in enumerate(entries):
            if entry is None:
                requests.append(self._filler(template, self.slots[instance][row]))
                fillers.add(row)
            else:
                requests.append(entry.request)
        batch = Batch(requests, self.max_batch_size, fillers=frozenset(fillers))
        try:
            results = await self.pool.execute(instance, batch)
        except BaseException as exc:  # cancelled while closing: fail the batch rather than hang its clients
            failure = exc if isinstance(exc, Exception) else Unavailable(f"model '{self.model}' is unloading")
            self._finish_batch(chosen, entries, wanted, [failure] * len(requests))
            if not isinstance(exc, Exception):
                raise
            return
        self._finish_batch(chosen, entries, wanted, [await _settled(r) for r in results])

    def _finish_batch(
        self,
        chosen: list[_Slot | None],
        entries: list[_Entry | None],
        wanted: list[list[str] | None],
        results: list[RequestResult],
    ) -> None:
        now = time.monotonic_ns()
        for slot, entry, asked, result in zip(chosen, entries, wanted, results, strict=True):
            if slot is None or entry is None:
                continue
            slot.last_ns = now
            if self.iterative and isinstance(result, Rescheduled):
                if self._reschedule(slot, entry, now):
                    continue
                result = Cancelled("Request was cancelled")
            if isinstance(result, dict):  # None: a decoupled model answered through its stream
                state = slot.state if slot.state is not None else {}
                for out_name, in_name in self.state_outputs.items():
                    value = result.get(out_name)
                    if value is None:
                        result = InternalError(
                            f"model '{self.model}' did not produce state output '{out_name}' for sequence {slot.corrid}"
                        )
                        break
                    state[in_name] = np.array(value, copy=True)  # results are views into the batch output
                else:
                    slot.state = state
                    keep = asked if asked is not None else self.config_outputs
                    result = {n: a for n, a in result.items() if n in keep}
            answer(entry.future, result)
            if entry.seq.end or (self.iterative and not slot.queue):
                # iterative: a request released without RESCHEDULE ends its sequence (Triton enqueues a cancelled
                # END request behind it: requests already queued for the sequence run first)
                self._release(slot)

    def _reschedule(self, slot: _Slot, entry: _Entry, now: int) -> bool:
        """The model released ``entry``'s request with RELEASE_RESCHEDULE: it runs again, first in its slot,
        with neither START nor END (IterativeSequencer::RescheduleRequest). False when its caller is gone."""
        request = entry.request
        if entry.future.done() or request.cancelled:
            return False
        if SEQUENCE_ID in request.parameters:  # what the model's request.flags() shows: 0
            request.parameters = {**request.parameters, SEQUENCE_START: False, SEQUENCE_END: False}
        request.queued_ns = now
        slot.queue.appendleft(_Entry(request, entry.future, Sequence(entry.seq.correlation_id), now))
        self._wake[slot.instance].set()
        return True

    def _add_controls(self, request: InferenceRequest, seq: Sequence, ready: bool, corrid: Corrid | None) -> None:
        shape = [1, 1] if self.batching else [1]
        for c in self.controls:
            if c.kind == "CONTROL_SEQUENCE_CORRID":
                value: Any = corrid if corrid is not None else (0 if c.dtype != np.dtype(object) else "")
                if c.dtype == np.dtype(object):
                    value = str(value).encode()
                array = np.empty(shape, dtype=c.dtype) if c.dtype == np.dtype(object) else np.zeros(shape, c.dtype)
                array.reshape(-1)[0] = value
            else:
                flag = {
                    "CONTROL_SEQUENCE_START": seq.start and ready,
                    "CONTROL_SEQUENCE_END": seq.end and ready,
                    "CONTROL_SEQUENCE_READY": ready,
                }[c.kind]
                array = np.full(shape, c.values[1 if flag else 0], dtype=c.dtype)
            request.inputs[c.name] = array

    def _filler(self, template: InferenceRequest, slot: _Slot) -> InferenceRequest:
        """A zero request for an idle slot's row (direct strategy): READY false, never answered or counted."""
        inputs = {n: _zeros(list(a.shape), a.dtype) for n, a in template.inputs.items()}
        filler = InferenceRequest(self.model, template.model_version, inputs=inputs, requested_outputs=None)
        self._add_controls(filler, Sequence(), ready=False, corrid=slot.corrid)
        return filler

    # ---- slots ----------------------------------------------------------------------------------
    def _release(self, slot: _Slot) -> None:
        """The sequence in ``slot`` ended (or idled out): give the slot to the oldest backlog, else free it."""
        if slot.corrid is not None and self.active.get(slot.corrid) is slot:
            del self.active[slot.corrid]
        slot.corrid = None
        slot.state = None
        while self.backlogs:
            backlog = self.backlogs.popleft()
            if not backlog.entries or backlog.abandoned():  # nobody waits for it (Triton: a cancelled backlog)
                self._forget(backlog)
                continue
            slot.corrid = backlog.corrid
            slot.queue.extend(backlog.entries)
            slot.last_ns = time.monotonic_ns()
            if not backlog.ended:
                self.backlog_map.pop(backlog.corrid, None)
                self.active[backlog.corrid] = slot
            self._wake[slot.instance].set()
            return
        if slot.queue:  # a conflicting START queued behind the END keeps the slot
            return
        self.free.append(slot)
        self.free.sort(key=_Slot.order)

    async def _reap(self) -> None:
        """Free the slots of sequences idle for longer than max_sequence_idle_microseconds."""
        assert self._reaper_wake is not None
        while True:
            now = time.monotonic_ns()
            wait_ns = self.idle_ns
            for corrid, slot in list(self.active.items()):
                if slot.queue or self._busy[slot.instance]:
                    continue
                remaining = slot.last_ns + self.idle_ns - now
                if remaining > 0:
                    wait_ns = min(wait_ns, remaining)
                    continue
                log.info(
                    "sequence %s of model '%s' was idle for more than %d us: its slot is released",
                    corrid,
                    self.model,
                    self.idle_ns // 1000,
                )
                self._release(slot)
            wait_ns = min(wait_ns, self._reap_backlog(now))
            self._check_idle()
            await asyncio.sleep(wait_ns / 1e9 + 0.001)

    def _reap_backlog(self, now: int) -> int:
        """Drop backlogged sequences whose clients all went away and that sent nothing for
        max_sequence_idle_microseconds: without this they waited for a slot forever while live sequences held
        the slots, their requests' tensors with them. A backlogged sequence with a caller still waiting
        keeps waiting, however long (Triton's backlog has no idle limit for them). Returns the ns until the
        next one is due (``idle_ns`` when none is pending)."""
        wait_ns = self.idle_ns
        for backlog in list(self.backlogs):
            if not backlog.abandoned():
                continue
            remaining = backlog.last_ns + self.idle_ns - now
            if remaining > 0:
                wait_ns = min(wait_ns, remaining)
                continue
            log.info(
                "sequence %s of model '%s' waited in the backlog with no client left and was idle for more than "
                "%d us: its %d request(s) are dropped",
                backlog.corrid,
                self.model,
                self.idle_ns // 1000,
                len(backlog.entries),
            )
            self.backlogs.remove(backlog)
            self._forget(backlog)
        return wait_ns

    def _forget(self, backlog: _Backlog) -> None:
        """A backlogged sequence that never gets a slot: its id is unknown again (a later request without
        START is refused), its requests and their tensors are released."""
        if self.backlog_map.get(backlog.corrid) is backlog:
            del self.backlog_map[backlog.corrid]
        for entry in backlog.entries:
            if not entry.future.done():
                entry.future.cancel()
        backlog.entries.clear()

    def _check_idle(self) -> None:
        if self._idle is not None and not self.pending and not any(self._busy):
            self._idle.set()


def _zeros(shape: list[int], dtype: Any) -> np.ndarray:
    if dtype is None or np.dtype(dtype) == np.dtype(object):  # BYTES: empty strings
        out = np.empty(shape, dtype=object)
        out.reshape(-1)[:] = b""
        return out
    return np.zeros(shape, dtype=dtype)


async def _settled(result: RequestResult) -> RequestResult:
    """A result the backend delivers later (async Python models), awaited; its failure as the result."""
    if not isinstance(result, Future):
        return result
    try:
        return await asyncio.wrap_future(result)
    except Exception as exc:  # the request's own failure, answered to it
        return exc
