"""Models on demand within a memory budget (``--model-load-on-demand``, ``--model-cache-memory-budget``).

Beyond Triton, which loads what its control mode says and nothing more (teams race their own load and
unload calls instead): every model of the repository is known (the index lists the ones not loaded,
UNAVAILABLE with ``NOT_LOADED``) and loads on its first request, which waits for the load up to
``--model-load-timeout`` and then gets 503 / UNAVAILABLE in Triton's words for a model without a
serving version. Before a load that would pass the budget, the least recently used idle models are
unloaded; idle means no request in flight, no live sequence, no request waiting for it and no pin (a
model loaded through the repository API stays until it is unloaded through it). Models idle for
``--model-idle-unload-seconds`` are unloaded as well.

Callers may be hostile (any client that can send a request can make a model load), so no load holds
anything the others need: a load reserves its estimated bytes of the budget and one of the
``--model-load-thread-count`` load slots, and gives both back when it returns, so a slow load delays
neither requests to loaded models nor other loads. A load still running after
``--model-load-abandon-seconds`` is abandoned: its requests are answered, the model is refused until
that load has returned (what it loaded is unloaded) and as long again has passed; its slot and its
reservation stay taken until it returns, because its thread and memory do. A model that alone needs
more than the whole budget is refused with the reason instead of loading. Loads that must unload
another model to make room are limited to ``--model-cache-swaps-per-minute``: past it, a request for a
model that needs room is told to try again and no loaded model is unloaded (callers cycling through
more models than the budget holds cannot thrash the models that fit).

The memory a load adds is measured by the lifecycle around each version's build (``footprint``); it is
kept in the version's statistics (``memory_usage``) and is what the budget counts. A reading belongs to
its model alone only when no other load or unload ran meanwhile and the load was not its backend's first
(which carries the runtime's own start-up): only such readings estimate later loads and refuse a model
as too big (a model's last one while its files stay as they were). Before a model's first load its cost
is guessed from the size of its files. After each unload freed heap pages go back to the system, so that
RSS follows what is loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import pb
from ..repository.config_name import config_files
from ..repository.layout import NOT_LOADED, check_model_name
from ..repository.roots import NotUnique, RepositorySet
from ..vocabulary.errors import InvalidArgument, NotFound, ServerError, Unavailable
from . import footprint
from .lifecycle import ModelEntry, ModelLifecycle, ModelState, VersionState
from .model import ModelVersion

if TYPE_CHECKING:
    from .registry import ModelRegistry

log = logging.getLogger(__name__)

#: how often a load that waits for room looks again whether a model became idle (seconds)
ROOM_POLL = 0.05
#: recent loads whose sizes (and bytes per file byte) estimate the cost of a model's first load here
RATIO_SAMPLES = 32
#: the window of ``--model-cache-swaps-per-minute`` (seconds)
SWAP_WINDOW = 60.0


@dataclass
class CacheSettings:
    #: bytes of host memory the loaded models may take (0: no budget, models still load on demand)
    memory_budget: int = 0
    #: unload a model no request used for this long (0: never)
    idle_unload_seconds: float = 0.0
    #: longest a request waits for its model to load (and for room to load it)
    load_timeout: float = 60.0
    #: a load still running after this long is abandoned (and the model refused as long again)
    abandon_seconds: float = 600.0
    #: loads that unload another model for room, at most this many per minute (0: no limit)
    swaps_per_minute: int = 60


@dataclass
class CachedModel:
    """What the cache knows of one model name, loaded or not, with its counters (metrics)."""

    name: str
    last_used: float = 0.0
    #: loaded through the repository API: never evicted
    pinned: bool = False
    #: requests waiting for this model's load (it is not evicted meanwhile)
    waiters: int = 0
    #: host + GPU bytes its last load took (None: never loaded here); any reading, see ``size``
    measured: footprint.Footprint | None = None
    #: host bytes of its last load that ran alone and was not its backend's first, and the files it read
    size: int | None = None
    size_files: tuple[int, int, int] | None = None
    #: why requests do not load it now (an abandoned load), until ``retry_at`` and ``orphan`` returned
    failure: str = ""
    retry_at: float = 0.0
    #: the abandoned load, still running (its slot and reservation stay taken until it returns)
    orphan: asyncio.Task[bool] | None = None
    #: why its last load was refused as bigger than the whole budget (the index shows it; "" once it loads)
    too_big: str = ""
    loads: int = 0
    load_seconds: float = 0.0
    evictions_budget: int = 0
    evictions_idle: int = 0
    hits: int = 0
    waits: int = 0
    wait_failures: int = 0


class SwapWindow:
    """Loads that unloaded another model to make room, over the last ``window`` seconds: at most ``limit``
    (``--model-cache-swaps-per-minute``; 0: no limit). A sliding window of start times, so that a burst is
    refused for exactly as long as it takes the oldest swap to leave the window."""

    def __init__(self, limit: int, window: float = SWAP_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._times: deque[float] = deque()

    def wait(self, now: float) -> float:
        """Seconds until one more swap is allowed (0: now)."""
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()
        if not self.limit or len(self._times) < self.limit:
            return 0.0
        return self._times[0] + self.window - now

    def record(self, now: float) -> None:
        self._times.append(now)


class ModelCache:
    """Loads models on request within the budget; the registry routes through ``resolve``."""

    def __init__(self, registry: ModelRegistry, settings: CacheSettings) -> None:
        self.registry = registry
        self.lifecycle: ModelLifecycle = registry.lifecycle
        self.models: dict[str, ModelEntry] = registry.lifecycle.models
        self.repository_path: Path = registry.repository_path
        #: every repository (``--model-repository`` repeated): a model's folder is in the one that holds it
        roots = getattr(registry, "roots", None)  # a stand-in registry (unit tests) has one repository only
        self.roots = roots if isinstance(roots, RepositorySet) else RepositorySet([self.repository_path])
        self.settings = settings
        self.known: dict[str, CachedModel] = {}
        #: loads running at once, abandoned ones until they return (``--model-load-thread-count``, as
        #: Triton's load thread pool): a load that never returns holds a thread, so they must not pile up
        self._slots = asyncio.Semaphore(self.lifecycle.load_threads)
        #: budget bytes taken by each load in progress (until its own footprint counts instead)
        self._reserved: dict[str, int] = {}
        #: the load in progress per model, shared by every request waiting for it
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._idle_task: asyncio.Task[None] | None = None
        #: loads waiting for an idle model to unload, with the bytes they need (for the 503's words)
        self._room_wanted: dict[str, int] = {}
        #: loads waiting for a load slot (for the 503's words)
        self._slot_wanted: set[str] = set()
        self._swaps = SwapWindow(settings.swaps_per_minute)
        #: when the swap limit was last logged as reached (one warning per window)
        self._swaps_logged = -SWAP_WINDOW
        #: loads and unloads in progress, and started so far: a memory reading is a model's own only when
        #: nothing else ran during its load
        self._active = 0
        self._started = 0
        #: backends (or platforms) loaded once already: a backend's first load carries its runtime's start-up
        self._backends_loaded: set[str] = set()
        #: measured host bytes of recent loads (not a backend's first)
        self._sizes: list[int] = []
        #: measured host bytes per byte of model files, of recent loads (for models never loaded here)
        self._ratios: list[float] = []
        self.lifecycle.measure_footprint = True
        self.lifecycle.on_demand = True
        self._now: Callable[[], float] = time.monotonic

    # ---- what the metrics and the index read ----------------------------------------------------
    @property
    def budget(self) -> int:
        return self.settings.memory_budget

    def used(self) -> footprint.Footprint:
        """Memory the loaded models took when they loaded."""
        total = footprint.Footprint()
        for entry in self.models.values():
            for mv in entry.serving.values():
                if mv.footprint is not None:
                    total = total.plus(mv.footprint)
        return total

    def committed(self) -> int:
        """Host bytes of the budget taken: the loaded models' and the reservations of loads in progress."""
        return self.used().host + sum(self._reserved.values())

    def footprints(self, name: str) -> list[tuple[str, footprint.Footprint]]:
        """(version, footprint) of each serving version of ``name`` that was measured."""
        entry = self.models.get(name)
        if entry is None:
            return []
        return [(mv.version_str, mv.footprint) for v, mv in sorted(entry.serving.items()) if mv.footprint is not None]

    def loaded_names(self) -> list[str]:
        return sorted(n for n, e in self.models.items() if e.serving)

    def _state(self, name: str) -> CachedModel:
        state = self.known.get(name)
        if state is None:
            state = self.known[name] = CachedModel(name)
        return state

    # ---- the request path -------------------------------------------------------------------
    async def resolve(self, name: str, version: str, sequence: object = None) -> ModelVersion:
        """The serving version for a request, loading the model first when it is not loaded."""
        entry = self.models.get(name)
        state = self.known.get(name)
        if state is not None and state.failure:
            self._check_not_refused(state)
        if entry is not None and entry.serving:
            state = state or self._state(name)
            state.last_used = self._now()
            state.hits += 1
            return self.registry.resolve(name, version, sequence)
        if entry is not None and entry.states and name not in self._loading and not self._retiring(entry):
            # a failed load (its reason is in the index) is not retried per request: a change of its
            # files (the poll) or an explicit load tries again
            return self.registry.resolve(name, version, sequence)
        self._check_known(name)
        state = self._state(name)
        state.waiters += 1
        state.waits += 1
        try:
            task = self._loading.get(name) or self._start_load(name)
            try:
                await asyncio.wait_for(asyncio.shield(task), self.settings.load_timeout)
            except asyncio.TimeoutError:
                state.wait_failures += 1
                raise Unavailable(self._not_in_time(name)) from None
            except ServerError:
                state.wait_failures += 1
                raise
            state.last_used = self._now()
            return self.registry.resolve(name, version, sequence)
        finally:
            state.waiters -= 1

    def _check_not_refused(self, state: CachedModel) -> None:
        """Raise UNAVAILABLE while ``state``'s model is refused after an abandoned load."""
        text = self._refusal(state)
        if text:
            raise Unavailable(f"Request for unknown model: '{state.name}' has no available versions: {text}")

    def _refusal(self, state: CachedModel) -> str:
        """Why requests do not load the model now ("" when they may)."""
        if not state.failure:
            return ""
        if state.orphan is not None:
            return f"{state.failure}; it is not loaded again before that load has returned"
        left = state.retry_at - self._now()
        if left > 0:
            return f"{state.failure}; a request loads it again in {left:.0f}s"
        return ""

    def _not_in_time(self, name: str) -> str:
        text = f"Request for unknown model: '{name}' has no available versions: "
        if name in self._room_wanted:
            return text + self._full(name, self._room_wanted[name])
        waited = f"it did not load within {self.settings.load_timeout:g}s of the request (--model-load-timeout)"
        if name in self._slot_wanted:
            return (
                text + f"{waited}: all {self.lifecycle.load_threads} loads at once (--model-load-thread-count) "
                "are taken by loads in progress"
            )
        return text + f"{waited}; it is still loading"

    def _full(self, name: str, needed: int) -> str:
        return (
            f"loading it needs {_bytes(needed)} and the model cache's {_bytes(self.budget)} "
            f"(--model-cache-memory-budget) are held by {len(self.loaded_names())} models that are all in use"
            + (f" and {len(self._reserved)} loads in progress" if self._reserved else "")
        )

    def resolve_now(self, name: str, version: str, sequence: object = None) -> ModelVersion:
        """For a request that cannot wait (a stream, started synchronously): the serving version; when the
        model is not loaded, its load starts and the request gets UNAVAILABLE (send it again)."""
        entry = self.models.get(name)
        state = self.known.get(name)
        if state is not None and state.failure:
            self._check_not_refused(state)
        if entry is not None and entry.serving:
            state = state or self._state(name)
            state.last_used = self._now()
            state.hits += 1
            return self.registry.resolve(name, version, sequence)
        if entry is None or self._retiring(entry):
            self._check_known(name)
            if name not in self._loading:
                self._start_load(name)
            raise Unavailable(
                f"Request for unknown model: '{name}' has no available versions: {NOT_LOADED}; it is loading "
                "now, send the request again"
            )
        return self.registry.resolve(name, version, sequence)

    def _start_load(self, name: str) -> asyncio.Task[None]:
        task = self._loading[name] = asyncio.ensure_future(self._load(name))

        def done(t: asyncio.Task[None]) -> None:
            self._loading.pop(name, None)
            if t.cancelled() or t.exception() is None:
                return
            # its waiters got it; a stream's load has none. A refusal (no room, the swap limit, too big,
            # abandoned) is the cache doing its job, logged where it is decided, not once per request here
            level = logging.DEBUG if isinstance(t.exception(), Unavailable) else logging.ERROR
            log.log(level, "model cache: loading '%s' failed: %s", name, t.exception())

        task.add_done_callback(done)
        return task

    @staticmethod
    def _retiring(entry: ModelEntry) -> bool:
        return all(s.state == ModelState.UNLOADING for s in entry.states.values())

    def loadable(self, name: str) -> bool:
        """A repository model a request would load now: not loaded, not failed (its reason stands)."""
        entry = self.models.get(name)
        if entry is not None and entry.serving:
            return False
        if entry is not None and entry.states and name not in self._loading and not self._retiring(entry):
            return False
        state = self.known.get(name)
        if state is not None and self._refusal(state):
            return False
        try:
            self._check_known(name)
        except NotFound:
            return False
        return True

    def _check_known(self, name: str) -> None:
        try:
            check_model_name(name)
        except InvalidArgument:
            raise NotFound(f"Request for unknown model: '{name}' is not found") from None
        try:
            folder = self.roots.locate(name) / name
        except NotUnique:  # not served while it is in several repositories (as Triton)
            raise NotFound(f"Request for unknown model: '{name}' is not found") from None
        if not any((folder / f).is_file() for f in config_files(self.registry.lifecycle.config_name)):
            raise NotFound(f"Request for unknown model: '{name}' is not found")

    # ---- one load ---------------------------------------------------------------------------
    async def _load(self, name: str, override: pb.ModelConfig | None = None, pin: bool = False) -> None:
        """Load ``name`` for its requests (or, ``pin``, for the repository API): a slot, then room in the
        budget, then the load itself, which is abandoned past ``--model-load-abandon-seconds``."""
        entry = self.models.get(name)
        if entry is not None and entry.serving and override is None:
            if pin:
                self._state(name).pinned = True
            return
        state = self._state(name)
        if state.failure:
            refusal = self._refusal(state)
            if refusal and pin and state.orphan is not None:
                raise Unavailable(f"failed to load '{name}': {refusal}")
            if refusal and not pin:
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions: {refusal}")
            state.failure = ""  # past the back-off, or an explicit load: try again
        self._slot_wanted.add(name)
        try:
            await self._slots.acquire()
        finally:
            self._slot_wanted.discard(name)
        handed_over = False
        try:
            needed = await self._needed(name, pin)
            await self._make_room(name, needed, limited=not pin)
            load = asyncio.ensure_future(self._load_now(name, override, state))
            load.set_name(f"'{name}'")
            handed_over = True  # from here the load gives back its slot and reservation when it returns
            try:
                alone = await asyncio.wait_for(asyncio.shield(load), self.settings.abandon_seconds)
            except asyncio.TimeoutError:
                if entry is not None and entry.serving:  # a reload (override): what serves goes on serving
                    raise InvalidArgument(
                        f"failed to load '{name}': its reload did not finish within {self.settings.abandon_seconds:g}s "
                        "(--model-load-abandon-seconds); the loaded version keeps serving and the reload goes on"
                    ) from None
                text = self._abandon(name, state, load)
                raise (
                    InvalidArgument(f"failed to load '{name}': {text}")
                    if pin
                    else Unavailable(f"Request for unknown model: '{name}' has no available versions: {text}")
                ) from None
            except InvalidArgument as exc:
                if name not in self.models:  # its folder went away meanwhile
                    raise NotFound(f"Request for unknown model: '{name}' is not found") from None
                if not pin:
                    # the failure is in the entry's states; resolve() answers with it
                    log.error("%s", exc)
                    return
                raise
        finally:
            if not handed_over:
                self._reserved.pop(name, None)
                self._slots.release()
        await self._loaded(name, state, alone, pin)

    async def _load_now(self, name: str, override: pb.ModelConfig | None, state: CachedModel) -> bool:
        """The load itself, shielded from its waiters; returns whether it ran alone (its memory reading is
        its own). Gives back the slot and the reservation when it returns, abandoned or not; what an
        abandoned load loaded is unloaded then."""
        alone = self._active == 0
        self._active += 1
        self._started += 1
        mark = self._started
        started = self._now()
        try:
            await self.lifecycle.load_model(name, override)
            alone = alone and self._started == mark
        finally:
            self._active -= 1
            state.load_seconds += self._now() - started
            self._reserved.pop(name, None)
            if state.orphan is asyncio.current_task():
                await self._returned(name, state)
            self._slots.release()
        return alone

    def _abandon(self, name: str, state: CachedModel, load: asyncio.Task[bool]) -> str:
        """The load of ``name`` ran past ``--model-load-abandon-seconds``: refuse the model until it has
        returned and as long again has passed (or an explicit load); show the reason in the index."""
        limit = self.settings.abandon_seconds
        state.failure = f"its load did not finish within {limit:g}s (--model-load-abandon-seconds) and was abandoned"
        state.orphan = load
        load.add_done_callback(_retrieved)  # nobody awaits it any more
        entry = self.models.get(name)
        if entry is not None:
            for v, s in list(entry.states.items()):
                if s.state == ModelState.LOADING:
                    entry.states[v] = VersionState(ModelState.UNAVAILABLE, state.failure)
        log.warning(
            "model cache: abandoned the load of '%s' after %gs (--model-load-abandon-seconds); it keeps a load "
            "slot and %s of the budget until it returns",
            name,
            limit,
            _bytes(self._reserved.get(name, 0)),
        )
        return self._refusal(state)

    async def _returned(self, name: str, state: CachedModel) -> None:
        """An abandoned load returned: unload what it loaded; requests may load the model again after the
        back-off (as long again as the load was given)."""
        state.orphan = None
        state.retry_at = self._now() + self.settings.abandon_seconds
        entry = self.models.get(name)
        if entry is not None and entry.serving:
            await self._unload(name)
        if self.models.get(name) is entry and entry is not None and not entry.serving:
            for v, s in list(entry.states.items()):
                if s.state != ModelState.UNAVAILABLE:
                    entry.states[v] = VersionState(ModelState.UNAVAILABLE, state.failure)
        log.info("model cache: the abandoned load of '%s' returned; what it loaded is unloaded", name)

    async def _loaded(self, name: str, state: CachedModel, alone: bool, pin: bool) -> None:
        """Book a finished load: counters, its measured size (when its reading is its own), a model over the
        whole budget unloaded and refused, then idle models unloaded if the budget is passed."""
        state.loads += 1
        state.last_used = self._now()
        state.too_big = ""
        if pin:
            state.pinned = True
        state.measured = self._model_footprint(name)
        files, signature = await asyncio.to_thread(self._files, name)
        entry = self.models.get(name)
        backend = (entry.config.backend or entry.config.platform) if entry is not None and entry.config else ""
        first = backend not in self._backends_loaded  # carries the runtime's own start-up
        self._backends_loaded.add(backend)
        if state.measured is not None and alone and not first:
            state.size, state.size_files = state.measured.host, signature
            self._sizes.append(state.size)
            del self._sizes[:-RATIO_SAMPLES]
            if files > 1 << 20:  # small files say little about the ratio
                self._ratios.append(state.size / files)
                del self._ratios[:-RATIO_SAMPLES]
            if self.budget and state.size > self.budget:
                await self._unload(name)
                raise self._too_big(name, state.size, "measured at its load", pin)
        log.info(
            "model cache: loaded '%s' (%s%s); %s of %s in use by %d models",
            name,
            _bytes(state.measured.host if state.measured else 0),
            "" if alone else ", beside other loads",
            _bytes(self.used().host),
            _bytes(self.budget) if self.budget else "no budget",
            len(self.loaded_names()),
        )
        await self._trim(keep=name)

    def _too_big(self, name: str, size: int, how: str, pin: bool) -> ServerError:
        text = (
            f"it needs {_bytes(size)} ({how}), more than the model cache's whole budget of {_bytes(self.budget)} "
            "(--model-cache-memory-budget)"
        )
        state = self._state(name)
        if state.too_big != text:  # once, not per request
            log.warning("model cache: '%s' is not loaded: %s", name, text)
        state.too_big = text
        if pin:
            return InvalidArgument(f"failed to load '{name}': {text}")
        return Unavailable(f"Request for unknown model: '{name}' has no available versions: {text}")

    def _model_footprint(self, name: str) -> footprint.Footprint | None:
        entry = self.models.get(name)
        if entry is None or not entry.serving:
            return None
        total = footprint.Footprint()
        for mv in entry.serving.values():
            if mv.footprint is not None:
                total = total.plus(mv.footprint)
        return total

    async def _needed(self, name: str, pin: bool) -> int:
        """Budget bytes to reserve for loading ``name``; a model that alone needs more than the whole budget
        (its own measured size, or its files) is refused."""
        needed, own, how = await asyncio.to_thread(self._estimate, name)
        if not self.budget:
            return needed
        if own > self.budget:
            raise self._too_big(name, own, how, pin)
        return needed  # more than the budget only by a guess from other models' sizes: no reason to refuse

    def _estimate(self, name: str) -> tuple[int, int, str]:
        """(bytes a load of ``name`` will take, what ``name`` itself is known to need, how that is known):
        its last reading of its own while its files are unchanged, else the size of its files times what
        loads here took per file byte so far (the median; a runtime keeps more than the file), and at least
        a typical load here (a Python model's files say little)."""
        files, signature = self._files(name)
        state = self.known.get(name)
        if state is not None and state.size is not None and state.size_files == signature:
            return state.size, state.size, "measured at its last load"
        ratios = sorted(self._ratios)
        ratio = max(1.0, ratios[len(ratios) // 2]) if ratios else 1.0
        by_files = int(files * ratio)
        sizes = sorted(self._sizes) or sorted(s.measured.host for s in self.known.values() if s.measured)
        typical = sizes[len(sizes) // 2] if sizes else 0
        return max(by_files, typical), by_files, f"estimated from its {_bytes(files)} of files"

    def _files(self, name: str) -> tuple[int, tuple[int, int, int]]:
        """Bytes of the model's files, and (bytes, files, newest change) to tell whether they changed."""
        total = count = newest = 0
        try:
            for path in (self.roots.locate(name) / name).rglob("*"):
                if path.is_file() and not path.name.startswith("."):
                    st = path.stat()
                    total += st.st_size
                    count += 1
                    newest = max(newest, st.st_mtime_ns)
        except (OSError, NotUnique):
            pass
        return total, (total, count, newest)

    # ---- room in the budget -----------------------------------------------------------------
    def _idle(self, name: str, keep: str) -> bool:
        """Whether ``name`` may be unloaded now."""
        if name == keep or name in self._reserved:
            return False
        state = self.known.get(name)
        if state is not None and (state.pinned or state.waiters):
            return False
        entry = self.models.get(name)
        if entry is None or not entry.serving or entry.lock.locked():
            return False
        return all(mv.inflight == 0 and not mv.scheduler.holds_state for mv in entry.serving.values())

    def _victim(self, keep: str) -> str | None:
        """The least recently used idle model, or None."""
        idle = [n for n in self.loaded_names() if self._idle(n, keep)]
        if not idle:
            return None
        return min(idle, key=lambda n: self.known[n].last_used if n in self.known else 0.0)

    async def _make_room(self, name: str, needed: int, limited: bool) -> None:
        """Reserve ``needed`` bytes of the budget for loading ``name``, unloading idle models to make room
        (waiting for one to become idle, up to ``--model-load-timeout``). ``limited``: a request's load,
        which may unload others only within ``--model-cache-swaps-per-minute``.

        Each check and its reservation run without an await between them, so concurrent loads never both
        count the same room; no lock is held while an eviction or a load runs."""
        deadline = self._now() + self.settings.load_timeout
        swapped = False
        try:
            while True:
                if not self.budget or self.committed() + needed <= self.budget:
                    self._reserved[name] = needed
                    return
                victim = self._victim(keep=name)
                if victim is None:  # every loaded model is in use, or the rest is other loads' reservations
                    if needed > self.budget:
                        # a guess (from other models' sizes: its own are within the budget) that no waiting
                        # can make room for: it loads beside the models in use, and its reading decides next
                        self._reserved[name] = needed
                        return
                    if self._now() >= deadline:
                        raise Unavailable(
                            f"Request for unknown model: '{name}' has no available versions: "
                            + self._full(name, needed)
                        )
                    self._room_wanted[name] = needed
                    await asyncio.sleep(ROOM_POLL)
                    continue
                if limited and not swapped:
                    self._check_swaps(name)
                    self._swaps.record(self._now())
                    swapped = True
                await self._evict(victim, "budget")
        finally:
            self._room_wanted.pop(name, None)

    def _check_swaps(self, name: str) -> None:
        """Raise UNAVAILABLE ("try again") when loading ``name`` would pass ``--model-cache-swaps-per-minute``."""
        now = self._now()
        wait = self._swaps.wait(now)
        if wait <= 0:
            return
        limit = self.settings.swaps_per_minute
        if now - self._swaps_logged >= SWAP_WINDOW:
            self._swaps_logged = now
            log.warning(
                "model cache: %d loads unloaded another model within %gs (--model-cache-swaps-per-minute): "
                "requests for models not loaded that need room are refused for %.0fs",
                limit,
                SWAP_WINDOW,
                wait,
            )
        raise Unavailable(
            f"Request for unknown model: '{name}' has no available versions: {NOT_LOADED}, and loading it would "
            f"unload another model after {limit} such loads within the last {SWAP_WINDOW:g}s "
            f"(--model-cache-swaps-per-minute); try again in {max(1, round(wait))}s"
        )

    async def _trim(self, keep: str) -> None:
        """After a load measured more than its estimate: unload idle models until the budget holds again."""
        while self.budget and self.committed() > self.budget:
            victim = self._victim(keep)
            if victim is None:
                return
            await self._evict(victim, "budget")

    async def _evict(self, name: str, why: str) -> None:
        state = self._state(name)
        freed = self._model_footprint(name)
        await self._unload(name)
        if why == "idle":
            state.evictions_idle += 1
        else:
            state.evictions_budget += 1
        log.info(
            "model cache: unloaded '%s' (%s, %s); %s in use by %d models",
            name,
            why,
            _bytes(freed.host if freed else 0),
            _bytes(self.used().host),
            len(self.loaded_names()),
        )

    async def _unload(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        """Unload ``name`` and show it as not loaded (an unload overlapping a load blurs that load's reading)."""
        self._active += 1
        self._started += 1
        try:
            await self.lifecycle.unload_model(name, unload_dependents, wait)
        finally:
            self._active -= 1
        entry = self.models.get(name)
        if wait and entry is not None and not entry.serving:
            self.models.pop(name, None)  # shown as NOT_LOADED (or the cache's reason) from now on
            await asyncio.to_thread(footprint.release_free_memory)

    # ---- explicit control, poll, idle unloading ---------------------------------------------------
    async def load_pinned(self, name: str, override: pb.ModelConfig | None = None) -> None:
        """The repository API's load: load (or reload) within the budget and pin."""
        await self._load(name, override, pin=True)

    async def unload(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        """The repository API's unload: unpin, unload, and show the model as not loaded again."""
        self._state(name).pinned = False
        await self._unload(name, unload_dependents, wait)

    async def poll(self) -> None:
        """Reload loaded models whose files changed; forget models removed from the repository (a model
        with a load in progress is left to the next poll: see ``ModelLifecycle._poll_one``)."""
        await self.lifecycle.poll()

    def start(self) -> None:
        if self.settings.idle_unload_seconds > 0 and self._idle_task is None:
            self._idle_task = asyncio.ensure_future(self._unload_idle_forever())

    def stop(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None

    async def _unload_idle_forever(self) -> None:
        every = max(0.1, min(5.0, self.settings.idle_unload_seconds / 4))
        while True:
            await asyncio.sleep(every)
            try:
                await self.unload_idle()
            except Exception:
                log.exception("model cache: idle unloading failed")

    async def unload_idle(self) -> None:
        limit = self._now() - self.settings.idle_unload_seconds
        for name in self.loaded_names():
            state = self.known.get(name)
            if state is not None and state.last_used < limit and self._idle(name, keep=""):
                await self._evict(name, "idle")

    def index_rows(self, names: list[str]) -> list[dict[str, str]]:
        """Index rows for repository models that are not loaded (with the reason while one is refused)."""
        rows = []
        for n in names:
            state = self.known.get(n)
            reason = NOT_LOADED
            if state is not None:
                reason = (state.failure if self._refusal(state) else "") or state.too_big or NOT_LOADED
            rows.append({"name": n, "version": "", "state": "UNAVAILABLE", "reason": reason})
        return rows


def _retrieved(task: asyncio.Task[bool]) -> None:
    """Done callback of an abandoned load: its outcome, which no request waits for, goes to the log."""
    if not task.cancelled() and task.exception() is not None:
        log.info("model cache: the abandoned load of %s failed: %s", task.get_name(), task.exception())


def _bytes(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
