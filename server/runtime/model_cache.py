"""Models on demand within a memory budget (``--model-load-on-demand``, ``--model-cache-memory-budget``).

Beyond Triton, which loads what its control mode says and nothing more (teams race their own load and
unload calls instead): every model of the repository is known (the index lists the ones not loaded,
UNAVAILABLE with ``NOT_LOADED``) and loads on its first request, which waits for the load up to
``--model-load-timeout`` and then gets 503 / UNAVAILABLE in Triton's words for a model without a
serving version. Before a load that would pass the budget, the least recently used idle models are
unloaded; idle means no request in flight, no live sequence, no request waiting for it and no pin (a
model loaded through the repository API stays until it is unloaded through it). Models idle for
``--model-idle-unload-seconds`` are unloaded as well.

Loads and evictions go one at a time, under one lock, so that the memory a load adds (measured by the
lifecycle around each version's build, ``footprint``) belongs to that model alone; it is kept in the
version's statistics (``memory_usage``) and is what the budget counts. Before a model's first load its
cost is guessed from the size of its files (and corrected once measured). After each unload freed heap
pages go back to the system, so that RSS follows what is loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import pb
from ..repository.layout import NOT_LOADED, check_model_name
from ..vocabulary.errors import InvalidArgument, NotFound, ServerError, Unavailable
from . import footprint
from .lifecycle import ModelEntry, ModelLifecycle, ModelState
from .model import ModelVersion

if TYPE_CHECKING:
    from .registry import ModelRegistry

log = logging.getLogger(__name__)

#: how often a load that waits for room looks again whether a model became idle (seconds)
ROOM_POLL = 0.05
#: recent loads whose sizes (and bytes per file byte) estimate the cost of a model's first load here
RATIO_SAMPLES = 32


@dataclass
class CacheSettings:
    #: bytes of host memory the loaded models may take (0: no budget, models still load on demand)
    memory_budget: int = 0
    #: unload a model no request used for this long (0: never)
    idle_unload_seconds: float = 0.0
    #: longest a request waits for its model to load (and for room to load it)
    load_timeout: float = 60.0


@dataclass
class CachedModel:
    """What the cache knows of one model name, loaded or not, with its counters (metrics)."""

    name: str
    last_used: float = 0.0
    #: loaded through the repository API: never evicted
    pinned: bool = False
    #: requests waiting for this model's load (it is not evicted meanwhile)
    waiters: int = 0
    #: host + GPU bytes its last load took (None: never loaded here)
    measured: footprint.Footprint | None = None
    loads: int = 0
    load_seconds: float = 0.0
    evictions_budget: int = 0
    evictions_idle: int = 0
    hits: int = 0
    waits: int = 0
    wait_failures: int = 0


class ModelCache:
    """Loads models on request within the budget; the registry routes through ``resolve``."""

    def __init__(self, registry: ModelRegistry, settings: CacheSettings) -> None:
        self.registry = registry
        self.lifecycle: ModelLifecycle = registry.lifecycle
        self.models: dict[str, ModelEntry] = registry.lifecycle.models
        self.repository_path: Path = registry.repository_path
        self.settings = settings
        self.known: dict[str, CachedModel] = {}
        #: one load or eviction at a time (their memory readings must not overlap)
        self._lock = asyncio.Lock()
        #: the load in progress per model, shared by every request waiting for it
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._idle_task: asyncio.Task[None] | None = None
        #: loads waiting for an idle model to unload, with the bytes they need (for the 503's words)
        self._room_wanted: dict[str, int] = {}
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
        if entry is not None and entry.serving:
            state = self.known.get(name) or self._state(name)
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

    def _not_in_time(self, name: str) -> str:
        text = f"Request for unknown model: '{name}' has no available versions: "
        if name in self._room_wanted:
            return text + self._full(name, self._room_wanted[name])
        return (
            text + f"it did not load within {self.settings.load_timeout:g}s of the request (--model-load-timeout); "
            "it is still loading"
        )

    def _full(self, name: str, needed: int) -> str:
        return (
            f"loading it needs {_bytes(needed)} and the model cache's {_bytes(self.budget)} "
            f"(--model-cache-memory-budget) are held by {len(self.loaded_names())} models that are all in use"
        )

    def resolve_now(self, name: str, version: str, sequence: object = None) -> ModelVersion:
        """For a request that cannot wait (a stream, started synchronously): the serving version; when the
        model is not loaded, its load starts and the request gets UNAVAILABLE (send it again)."""
        entry = self.models.get(name)
        if entry is not None and entry.serving:
            state = self.known.get(name) or self._state(name)
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
            if not t.cancelled() and t.exception() is not None:  # its waiters got it; a stream's load has none
                log.error("model cache: loading '%s' failed: %s", name, t.exception())

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
        if not (self.repository_path / name / "config.pbtxt").is_file():
            raise NotFound(f"Request for unknown model: '{name}' is not found")

    async def _load(self, name: str, override: pb.ModelConfig | None = None, pin: bool = False) -> None:
        async with self._lock:
            entry = self.models.get(name)
            if entry is not None and entry.serving and override is None:
                if pin:
                    self._state(name).pinned = True
                return
            state = self._state(name)
            await self._make_room(name, await asyncio.to_thread(self._estimate, name))
            started = self._now()
            try:
                await self.lifecycle.load_model(name, override)
            except InvalidArgument as exc:
                if name not in self.models:  # its folder went away meanwhile
                    raise NotFound(f"Request for unknown model: '{name}' is not found") from None
                if not pin:
                    # the failure is in the entry's states; resolve() answers with it
                    log.error("%s", exc)
                    return
                raise
            finally:
                state.load_seconds += self._now() - started
            state.loads += 1
            state.last_used = self._now()
            if pin:
                state.pinned = True
            state.measured = self._model_footprint(name)
            files = await asyncio.to_thread(self._file_bytes, name)
            entry = self.models.get(name)
            backend = (entry.config.backend or entry.config.platform) if entry is not None and entry.config else ""
            first = backend not in self._backends_loaded  # carries the runtime's own start-up
            self._backends_loaded.add(backend)
            if state.measured is not None and not first:
                self._sizes.append(state.measured.host)
                del self._sizes[:-RATIO_SAMPLES]
                if files > 1 << 20:  # small files say little about the ratio
                    self._ratios.append(state.measured.host / files)
                    del self._ratios[:-RATIO_SAMPLES]
            log.info(
                "model cache: loaded '%s' (%s) in %.2fs; %s of %s in use by %d models",
                name,
                _bytes(state.measured.host if state.measured else 0),
                self._now() - started,
                _bytes(self.used().host),
                _bytes(self.budget) if self.budget else "no budget",
                len(self.loaded_names()),
            )
            await self._trim(keep=name)

    def _model_footprint(self, name: str) -> footprint.Footprint | None:
        entry = self.models.get(name)
        if entry is None or not entry.serving:
            return None
        total = footprint.Footprint()
        for mv in entry.serving.values():
            if mv.footprint is not None:
                total = total.plus(mv.footprint)
        return total

    def _estimate(self, name: str) -> int:
        """Host bytes a load of ``name`` will take: its last measured load, else the size of its files times
        what loads here took per file byte so far (the median; a runtime keeps more than the file)."""
        state = self.known.get(name)
        if state is not None and state.measured is not None:
            return state.measured.host
        ratios = sorted(self._ratios)
        ratio = max(1.0, ratios[len(ratios) // 2]) if ratios else 1.0
        by_files = int(self._file_bytes(name) * ratio)
        # a model whose files say little (a Python model's code): as much as a typical load here
        sizes = sorted(self._sizes) or sorted(s.measured.host for s in self.known.values() if s.measured)
        return max(by_files, sizes[len(sizes) // 2] if sizes else 0)

    def _file_bytes(self, name: str) -> int:
        total = 0
        try:
            for path in (self.repository_path / name).rglob("*"):
                if path.is_file() and not path.name.startswith("."):
                    total += path.stat().st_size
        except OSError:
            pass
        return total

    # ---- room in the budget -----------------------------------------------------------------
    def _idle(self, name: str, keep: str) -> bool:
        """Whether ``name`` may be unloaded now."""
        if name == keep:
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

    async def _make_room(self, name: str, needed: int) -> None:
        """Unload idle models until ``needed`` more bytes fit the budget (waits for one to become idle)."""
        if not self.budget:
            return
        deadline = self._now() + self.settings.load_timeout
        try:
            while self.used().host + needed > self.budget:
                victim = self._victim(keep=name)
                if victim is None:
                    held = self.used().host
                    if needed > self.budget or held == 0:
                        # waiting for the models in use cannot make room (it would not fit alone, or they
                        # hold nothing): it loads beside them; its measured size decides from its load on
                        if needed > self.budget:
                            log.warning(
                                "model cache: '%s' needs %s, more than the whole budget of %s: loading it anyway",
                                name,
                                _bytes(needed),
                                _bytes(self.budget),
                            )
                        return
                    if self._now() >= deadline:
                        raise Unavailable(
                            f"Request for unknown model: '{name}' has no available versions: "
                            + self._full(name, needed)
                        )
                    self._room_wanted[name] = needed
                    await asyncio.sleep(ROOM_POLL)
                    continue
                await self._evict(victim, "budget")
        finally:
            self._room_wanted.pop(name, None)

    async def _trim(self, keep: str) -> None:
        """After a load measured more than its estimate: unload idle models until the budget holds again."""
        while self.budget and self.used().host > self.budget:
            victim = self._victim(keep)
            if victim is None:
                return
            await self._evict(victim, "budget")

    async def _evict(self, name: str, why: str) -> None:
        state = self._state(name)
        freed = self._model_footprint(name)
        await self.lifecycle.unload_model(name)
        entry = self.models.get(name)
        if entry is not None and not entry.serving:
            self.models.pop(name, None)  # shown as NOT_LOADED from now on
        await asyncio.to_thread(footprint.release_free_memory)
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

    # ---- explicit control, poll, idle unloading ---------------------------------------------------
    async def load_pinned(self, name: str, override: pb.ModelConfig | None = None) -> None:
        """The repository API's load: load (or reload) within the budget and pin."""
        await self._load(name, override, pin=True)

    async def unload(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        """The repository API's unload: unpin, unload, and show the model as not loaded again."""
        self._state(name).pinned = False
        await self.lifecycle.unload_model(name, unload_dependents, wait)
        entry = self.models.get(name)
        if wait and entry is not None and not entry.serving:
            self.models.pop(name, None)
            await asyncio.to_thread(footprint.release_free_memory)

    async def poll(self) -> None:
        """Reload loaded models whose files changed; forget models removed from the repository."""
        async with self._lock:
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
        async with self._lock:
            for name in self.loaded_names():
                state = self.known.get(name)
                if state is not None and state.last_used < limit and self._idle(name, keep=""):
                    await self._evict(name, "idle")

    def index_rows(self, names: list[str]) -> list[dict[str, str]]:
        """Index rows for repository models that are not loaded."""
        return [{"name": n, "version": "", "state": "UNAVAILABLE", "reason": NOT_LOADED} for n in names]


def _bytes(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
