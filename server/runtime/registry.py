"""The model registry: routes (name, version) to a ready ModelVersion; the front door of the runtime.

Routing lives here; loading and unloading in ``lifecycle`` (which swaps what is routed to), the end of
service in ``shutdown``. The registry is what schedulers and backends see as ``RegistryView``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import pb
from ..observability.stats import StatsListener
from ..repository.agents import DEFAULT_DIRECTORY
from ..repository.roots import DUPLICATE_REASON, RepositorySet, ambiguous, identifier
from ..vocabulary.custom_metrics import CustomMetrics
from ..vocabulary.errors import InvalidArgument, NotFound, ServerError, Unavailable
from ..vocabulary.registry_view import AroundInfer, ModelControl
from ..vocabulary.sequence import SEQUENCE_ID
from ..vocabulary.streaming import ResponseStream
from ..vocabulary.types import InferenceRequest, InferenceResponse
from .cache import ResponseCache
from .cold_start import PhaseHook
from .lifecycle import ModelEntry, ModelLifecycle, ModelState
from .model import ModelVersion
from .model_cache import CacheSettings, ModelCache
from .shutdown import GracefulShutdown


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # built outside a loop (unit tests)
        return None


def weighted_version(
    traffic: dict[int, float], serving: dict[int, ModelVersion], sequence: object = None
) -> int | None:
    """A version drawn by ``traffic`` among the serving ones (their weights scaled to 100), or None when no
    weighted version serves. A sequence (its correlation id) always draws the same point, so all its
    requests reach the version that holds its state while the weights stay."""
    weighted = [(v, w) for v, w in sorted(traffic.items()) if w > 0 and v in serving]
    if not weighted:
        return None
    total = sum(w for _, w in weighted)
    if sequence in (None, 0, ""):
        point = random.random() * total
    else:
        digest = hashlib.blake2b(repr(sequence).encode(), digest_size=8).digest()
        point = int.from_bytes(digest, "big") / 2**64 * total
    for v, w in weighted:
        point -= w
        if point < 0:
            return v
    return weighted[-1][0]


class ModelRegistry:
    def __init__(
        self,
        repository_path: Path | RepositorySet,
        listeners: list[StatsListener] | None = None,
        drain_timeout: float = 300.0,
        auto_complete: bool = True,
        load_threads: int = 4,
        custom_metrics: CustomMetrics | None = None,
        response_cache: ResponseCache | None = None,
        allow_external_op_libraries: bool = True,
        model_cache: CacheSettings | None = None,
        model_config_name: str = "",
        repoagent_directory: str = DEFAULT_DIRECTORY,
    ) -> None:
        """``model_config_name``: ``--model-config-name`` (see ``repository.config_name``); ``repoagent_directory``:
        ``--repoagent-directory`` (see ``repository.agents``). ``repository_path``: the model repository, or several
        (``repository.roots``: ``--model-repository`` repeated)."""
        roots = repository_path if isinstance(repository_path, RepositorySet) else RepositorySet([repository_path])
        self.roots = roots
        #: the first repository (the only one unless several were given)
        self.repository_path = roots.first
        #: metric families Python models create; the metrics endpoint exports them
        self.custom_metrics = custom_metrics if custom_metrics is not None else CustomMetrics()
        self._models: dict[str, ModelEntry] = {}
        #: load/unload as the repository API offers them (the InferenceService sets itself here)
        self.model_control: ModelControl | None = None
        #: runs around each request ``infer`` routes: the OpenTelemetry tracer's model spans (``observability``)
        self.around_infer: AroundInfer | None = None
        #: the loop requests run on; instance threads call back into it (Python models' BLS)
        self.loop: asyncio.AbstractEventLoop | None = _running_loop()
        self.lifecycle = ModelLifecycle(
            self._models,
            roots,
            self,
            listeners if listeners is not None else [],
            drain_timeout,
            auto_complete=auto_complete,
            load_threads=load_threads,
            response_cache=response_cache,
            allow_external_op_libraries=allow_external_op_libraries,
            config_name=model_config_name,
            repoagent_directory=repoagent_directory,
        )
        self._shutdown = GracefulShutdown(self.loop)
        #: models on demand within a memory budget (None: models load as the control mode says)
        self.cache = ModelCache(self, model_cache) if model_cache is not None else None

    @property
    def on_load_failure(self) -> list[Callable[[str, str, str], None]]:
        """Hooks called with (model, version, reason) when a load fails (metrics)."""
        return self.lifecycle.on_load_failure

    @property
    def on_load_phase(self) -> list[PhaseHook]:
        """Hooks called with (model, version, phase, seconds) for each phase of a cold start (metrics)."""
        return self.lifecycle.on_load_phase

    @property
    def shutting_down(self) -> bool:
        return self._shutdown.started

    # ---- routing -------------------------------------------------------------------------
    def resolve(self, name: str, version: str = "", sequence: object = None) -> ModelVersion:
        """The version a request for ``name`` goes to: ``version``, else by the model's traffic weights (a
        sequence's requests, named by ``sequence``, all to the same one), else the highest serving one."""
        entry = self._entry(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name.rpartition('/')[2]}' is not found")
        name = entry.name
        serving = entry.serving
        if not version:
            if not serving:
                reason = self._reason(entry)
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions{reason}")
            if entry.traffic:
                chosen = weighted_version(entry.traffic, serving, sequence)
                if chosen is not None:
                    return serving[chosen]
            return serving[max(serving)]
        try:
            v = int(version)
        except ValueError:
            raise InvalidArgument(f"invalid model version '{version}': versions are integers") from None
        mv = serving.get(v)
        if mv is None:
            state = entry.states.get(v)
            if state is not None and state.state != ModelState.READY:
                raise Unavailable(
                    f"model '{name}' version {v} is not ready: {state.state.value}"
                    + (f" ({state.reason})" if state.reason else "")
                )
            raise NotFound(f"Request for unknown model: '{name}' version {v} is not found")
        return mv

    def _entry(self, name: str) -> ModelEntry | None:
        """The entry a request for ``name`` reaches. With namespacing (Triton's ``FindModelIdentifier``) the only
        model of that name, InvalidArgument with Triton's text when several repositories hold one; an ensemble's
        step names ``<repository>/<name>`` (``roots.identifier``): that repository's model, else the only one of
        that name (Triton's ``FindNode`` with fuzzy matching)."""
        entry = self._models.get(name)
        if entry is not None or not self.roots.namespacing:
            return entry
        namespace, sep, base = name.rpartition("/")
        if sep:
            if Path(namespace) not in self.roots.paths:
                return None
            name = base
        found = [e for e in self._models.values() if e.name == name and not e.gone]
        if len(found) > 1:
            raise InvalidArgument(ambiguous(name, len(found)))
        return found[0] if found else None

    def _by_weights(self, request: InferenceRequest, mv: ModelVersion) -> bool:
        """Whether ``request`` reached ``mv`` through the model's traffic weights: it named no version and
        ``mv`` has a weight above 0 (``resolve`` draws among those; it falls back to the highest version
        only when none of them serves, and that one has none). Its statistics count such requests apart."""
        if request.model_version:
            return False
        try:
            entry = self._entry(request.model_name)
        except ServerError:
            return False
        return entry is not None and entry.traffic.get(mv.version, 0) > 0

    @staticmethod
    def _reason(entry: ModelEntry) -> str:
        reasons = [s.reason for s in entry.states.values() if s.reason]
        return f": {reasons[0]}" if reasons else ""

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        around = self.around_infer
        if around is not None:
            return await around(request, self._route)
        return await self._route(request)

    async def _route(self, request: InferenceRequest) -> InferenceResponse:
        if self._shutdown.started:
            raise Unavailable("server is shutting down")
        cache = self.cache
        sequence = request.parameters.get(SEQUENCE_ID) if request.parameters else None
        if cache is None:
            mv = self.resolve(request.model_name, request.model_version, sequence)
        else:  # nothing awaits between the version's return and its in-flight count: no eviction in between
            mv = await cache.resolve(request.model_name, request.model_version, sequence)
        request.routed = self._by_weights(request, mv)
        if self.roots.namespacing:
            request.model_name = mv.name  # an ensemble step's "<repository>/<name>": the member sees its name
        return await self._shutdown.track(mv.infer(request))

    async def loaded(self, name: str, version: str = "") -> None:
        """With the model cache: load ``name`` if it is not loaded (metadata and config requests, streams)."""
        if self.cache is not None:
            await self.cache.resolve(name, version)

    def infer_stream(self, request: InferenceRequest) -> ResponseStream:
        if self._shutdown.started:
            raise Unavailable("server is shutting down")
        sequence = request.parameters.get(SEQUENCE_ID) if request.parameters else None
        if self.cache is not None:
            mv = self.cache.resolve_now(request.model_name, request.model_version, sequence)
        else:
            mv = self.resolve(request.model_name, request.model_version, sequence)
        request.routed = self._by_weights(request, mv)
        if self.roots.namespacing:
            request.model_name = mv.name
        return mv.infer_stream(request)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return self.resolve(name, version).decoupled

    def is_model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.resolve(name, version).scheduler.ready()
        except ServerError:
            return False

    def loads_on_demand(self, name: str) -> bool:
        return self.cache is not None and self.cache.loadable(name)

    def model_names(self) -> list[str]:
        if self.roots.namespacing:  # a name once, whichever repositories hold it
            return sorted({e.name for e in self._models.values()})
        return sorted(self._models)

    def ready_versions(self, name: str) -> list[ModelVersion]:
        """The serving versions of ``name`` (with namespacing, of every repository's model of that name)."""
        return [e.serving[v] for e in self.lifecycle.named(name) for v in sorted(e.serving)]

    def model_config(self, name: str, version: str = "") -> pb.ModelConfig:
        return self.resolve(name, version).config

    def all_ready(self) -> bool:
        ready = ModelState.READY
        return all(e.serving and all(s.state == ready for s in e.states.values()) for e in self._models.values())

    def index(self, ready_only: bool = False, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Triton's repository index: one row per known version (or per model without versions); with
        ``names``, the rows of those models only (a name neither loaded nor in the repository has none)."""
        rows: list[dict[str, Any]] = []
        duplicates: set[str] = set()
        if self.roots.namespacing:
            # a row per model of each repository (no name is a duplicate then); keys are ``roots.identifier``s
            if names is not None:
                wanted = {k for k, e in self._models.items() if e.name in names}
                wanted |= {identifier(r, n) for n in names for r in self.roots.holding(n)}
            else:
                wanted = set(self._models)
                if not ready_only:
                    wanted |= set(self.roots.listing().namespaced)
        elif names is not None:
            wanted = {n for n in names if n in self._models or self.roots.holds(n)}
            if self.roots.several:
                duplicates = {n for n in wanted if len(self.roots.holding(n)) > 1}
        else:
            wanted = set(self._models)
            found, duplicates = self.roots.names()
            if not ready_only:
                wanted |= set(found)
            wanted |= duplicates
        for key in sorted(wanted, key=lambda k: (k.rpartition("/")[2], k)):
            name = key.rpartition("/")[2]  # the key itself without namespacing
            if name in duplicates:
                # Triton's index: one row for a model in several repositories, whatever was loaded before
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": DUPLICATE_REASON})
                continue
            entry = self._models.get(key)
            if entry is None:
                rows += self.cache.index_rows([name]) if self.cache is not None else [{"name": name}]
                continue
            states = dict(entry.states)
            if not states:
                rows.append({"name": name})
            for v in sorted(states):
                s = states[v]
                if ready_only and s.state != ModelState.READY:
                    continue
                reason = s.reason
                serving = entry.serving.get(v)
                if s.state == ModelState.READY and not reason and serving is not None:
                    reason = serving.scheduler.unready_reason()  # e.g. a Python model's stub restarting
                row: dict[str, Any] = {
                    "name": name,
                    "version": str(v) if v else "",
                    "state": s.state.value,
                    "reason": reason,
                }
                if s.state == ModelState.READY and s.config_digest:
                    row["config_digest"] = s.config_digest  # kubeinfer's addition to Triton's index rows
                if s.state == ModelState.READY and serving is not None and serving.cold_start is not None:
                    row["cold_start"] = serving.cold_start.as_row()  # kubeinfer's too (see cold_start.py)
                rows.append(row)
        return rows

    # ---- lifecycle (see lifecycle.ModelLifecycle) ------------------------------------------------
    async def load_model(self, name: str, override: pb.ModelConfig | None = None) -> None:
        """Load (or reload) ``name``; with the model cache within its budget, and pinned."""
        if self.cache is not None:
            await self.cache.load_pinned(name, override)
        else:
            await self.lifecycle.load_model(name, override)

    async def unload_model(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        if self.cache is not None:
            await self.cache.unload(name, unload_dependents, wait)
        else:
            await self.lifecycle.unload_model(name, unload_dependents, wait)

    async def load_all(self) -> None:
        """Load every model of the repository (with the model cache: none, they load on request)."""
        if self.cache is not None:
            return
        await self.lifecycle.load_all()

    def start_background(self) -> None:
        """Background work after the start-up loads (the model cache's idle unloading)."""
        if self.cache is not None:
            self.cache.start()

    def failed_models(self) -> list[str]:
        return self.lifecycle.failed_models()

    async def poll(self) -> None:
        """Bring the loaded set in line with the repository (poll mode)."""
        if self.cache is not None:
            await self.cache.poll()
        else:
            await self.lifecycle.poll()

    async def poll_models(self, names: list[str]) -> None:
        """``poll`` for these models only, now."""
        await self.lifecycle.poll_models(names)

    async def shutdown(self, timeout: float) -> None:
        """Refuse new requests, let in-flight and queued ones finish (bounded by ``timeout``), then unload.

        Versions already retiring after a reload drain within the same bound (see ``shutdown``).
        """
        if self.cache is not None:
            self.cache.stop()
        everything = [mv for e in self._models.values() for mv in e.serving.values()]
        await self._shutdown.run(everything, self.lifecycle.background, timeout)

    @property
    def abandoned(self) -> list[str]:
        """Versions that did not close within the shutdown timeout (a model stuck in ``execute``)."""
        return self._shutdown.abandoned
