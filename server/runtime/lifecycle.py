"""The model lifecycle: load, reload, retire and unload versions, and the states the index reports.

States are Triton's ``ModelReadyState`` names. A version goes LOADING → READY; a reload keeps the READY
version serving until the new one is READY; a retired version goes UNLOADING (draining) → UNAVAILABLE
("unloaded"); a failed load is UNAVAILABLE with its reason.

Reload never interrupts service: a new or changed version loads in the background while the old one
serves; the routing table (``ModelEntry.serving``) is swapped in one assignment when the new one is
ready; the old version drains its in-flight and queued requests and only then unloads. A failed load
leaves what was serving in place and records the failure (index state/reason, log, metric).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..backends.loader import available_backends
from ..config import ConfigError, normalize_config, pb, validate_config
from ..config.traffic import parse_traffic, routing_neutral_digest
from ..config.version_policy import select_versions
from ..observability.stats import StatsListener
from ..repository import scan
from ..repository.agents import DEFAULT_DIRECTORY, AgentError, AgentSession, open_session
from ..repository.layout import check_model_name
from ..repository.model_files import ModelFolder
from ..repository.roots import (
    DUPLICATE_REASON,
    Listing,
    NotUnique,
    RepositorySet,
    identifier,
    not_unique,
    split_identifier,
)
from ..scheduling.rate_limiter import RateLimiter
from ..vocabulary.errors import InvalidArgument, ServerError
from ..vocabulary.registry_view import RegistryView
from . import devices, footprint
from .cache import ResponseCache
from .cold_start import ColdStart, PhaseHook
from .model import ModelVersion, build_model_version, prepare_config

log = logging.getLogger(__name__)


class FolderGone(Exception):
    """A polled model's folder is not in the repository (any more): unload it, it did not fail."""


class ModelState(str, Enum):
    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class VersionState:
    state: ModelState
    reason: str = ""
    #: ``scan.config_digest`` of the config a serving version was loaded from (the index reports it,
    #: so a writer such as the operator can tell that the server picked up a config-only change)
    config_digest: str = ""


def _serving_state(entry: ModelEntry, mv: ModelVersion, reason: str = "") -> VersionState:
    """READY with ``reason``, keeping the config digest the version was last found serving with."""
    before = entry.states.get(mv.version)
    return VersionState(ModelState.READY, reason, before.config_digest if before is not None else "")


@dataclass
class ModelEntry:
    """Everything the registry knows about one model name."""

    name: str
    #: versions that serve requests; replaced as a whole, never mutated in place
    serving: dict[int, ModelVersion] = field(default_factory=dict)
    #: what the index reports per version; key 0 holds a model-level failure with no version
    states: dict[int, VersionState] = field(default_factory=dict)
    config: pb.ModelConfig | None = None
    config_digest: str = ""
    #: config.pbtxt as last parsed, for the next read to skip the parse while its bytes stay the same
    parsed: scan.ParsedConfig | None = None
    override: pb.ModelConfig | None = None
    #: digest per version of the last load attempt, failed or not (poll mode retries only on change)
    attempted: dict[int, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: version → percent for requests that name no version (``config.traffic``; empty: the highest serves)
    traffic: dict[int, float] = field(default_factory=dict)

    #: its folder is gone and it is being unloaded (a poll that finds it gone again does nothing)
    gone: bool = False
    #: the repository agents of the load that serves (told UNLOAD when it is replaced or unloaded)
    agents: AgentSession | None = None
    #: the repository its folder was last read from (``repository.roots``: one of several); with namespacing
    #: the repository it belongs to, for good (its namespace: the entry is keyed by ``roots.identifier``)
    repository: Path | None = None


class ModelLifecycle:
    """Brings the registry's entries in line with the repository; owns every load and unload."""

    def __init__(
        self,
        models: dict[str, ModelEntry],
        repository_path: Path | RepositorySet,
        router: RegistryView,
        listeners: list[StatsListener],
        drain_timeout: float,
        auto_complete: bool = True,
        load_threads: int = 4,
        response_cache: ResponseCache | None = None,
        allow_external_op_libraries: bool = True,
        config_name: str = "",
        repoagent_directory: str = DEFAULT_DIRECTORY,
    ) -> None:
        #: the registry's routing table, shared: the lifecycle writes it, the registry reads it
        self.models = models
        #: the repositories (``--model-repository`` repeated); ``repository_path`` is the first
        self.roots = repository_path if isinstance(repository_path, RepositorySet) else RepositorySet([repository_path])
        self.repository_path = self.roots.first
        #: names found in more than one repository at the last look at all of them (not served, as Triton)
        self.duplicates: set[str] = set()
        #: handed to every version it builds (ensembles and BLS route through it)
        self.router = router
        self.listeners = listeners
        self.drain_timeout = drain_timeout
        #: retiring versions (drain, then close)
        self.background: set[asyncio.Task[Any]] = set()
        #: called with (model, version, reason) when a load fails (metrics hook)
        self.on_load_failure: list[Callable[[str, str, str], None]] = []
        #: called with (model, version, phase, seconds) for each phase of a version's cold start (metrics hook)
        self.on_load_phase: list[PhaseHook] = []
        #: False with ``--disable-auto-complete-config``: configs must be complete
        self.auto_complete = auto_complete
        #: models loaded at once by load_all (``--model-load-thread-count``)
        self.load_threads = max(1, load_threads)
        #: the server's response cache (``--cache-config``), handed to versions that enable it
        self.response_cache = response_cache
        #: False with ``--allow-external-op-libraries=false``: op libraries only from the model's own folder
        self.allow_external_op_libraries = allow_external_op_libraries
        #: --rate-limit=execution_count: the server's rate limiter (the app sets it; None: off)
        self.rate_limiter: RateLimiter | None = None
        #: ``--model-config-name``: read ``configs/<name>.pbtxt`` where a model has one (``repository.config_name``)
        self.config_name = config_name
        #: ``--repoagent-directory``: named where a config's repository agent is not found (``repository.agents``)
        self.repoagent_directory = repoagent_directory
        #: measure each version's memory around its build (the model cache: loads do not overlap then)
        self.measure_footprint = False
        #: models load on request (the model cache): the poll reloads loaded models only
        self.on_demand = False

        #: polled models looked at (and loaded) at once
        self._poll_gate = asyncio.Semaphore(self.load_threads)

    async def load_model(self, name: str, override: pb.ModelConfig | None = None, polled: bool = False) -> None:
        """Load or reload ``name``; ``override`` replaces its config.pbtxt for this load (as Triton).

        Raises InvalidArgument when a selected version failed to load; whatever was serving before
        keeps serving, and the message says so. ``polled`` (a poll's load): a folder that is gone by the
        time it is read raises ``FolderGone`` instead, for the poll to unload the model.
        """
        check_model_name(name)
        if self.roots.namespacing:
            await self._load_namespaced(name, override, polled)
            return
        try:
            self.roots.locate(name)
        except NotUnique:
            # Triton logs why and answers that the poll failed; what serves (if anything) stays as it is
            log.error("%s", not_unique(name))
            raise InvalidArgument(
                f"failed to load '{name}', failed to poll from model repository: "
                "not unique across all model repositories"
            ) from None
        await self._load_entry(name, name, None, override, polled)

    async def _load_namespaced(self, name: str, override: pb.ModelConfig | None, polled: bool) -> None:
        """``load_model`` with namespacing: the model ``name`` of every repository holding it (Triton loads every
        identifier of that name); InvalidArgument naming each that failed."""
        roots = self.roots.holding(name)
        if not roots:
            for key, entry in list(self.models.items()):
                if entry.name == name and not entry.serving and not entry.lock.locked():
                    self.models.pop(key, None)
            raise InvalidArgument(
                f"failed to load '{name}', failed to poll from model repository: "
                "model not found in any model repository"
            )
        errors: list[str] = []
        for root in roots:
            try:
                await self._load_entry(identifier(root, name), name, root, override, polled)
            except InvalidArgument as exc:
                errors.append(exc.message if len(roots) == 1 else f"{exc.message} (repository {root})")
        if errors:
            raise InvalidArgument("; ".join(errors))

    async def _load_at(self, key: str, polled: bool = False) -> None:
        """Load the model of routing-table key ``key`` (its name; with namespacing its ``identifier``)."""
        if not self.roots.namespacing:
            await self.load_model(key, polled=polled)
            return
        root, name = split_identifier(key)
        await self._load_entry(key, name, root, None, polled)

    async def _load_entry(
        self, key: str, name: str, root: Path | None, override: pb.ModelConfig | None, polled: bool
    ) -> None:
        """Load or reload the entry ``key`` (``root``: its repository with namespacing, else None: looked up)."""
        entry = self.models.get(key)
        if entry is None or entry.gone:  # gone: its unload goes on; a folder of that name is back
            entry = self.models[key] = ModelEntry(name, repository=root)
        async with entry.lock:
            entry.override = override
            failures = await self._reconcile(entry, polled)
        held = (root / name).is_dir() if root is not None else self.roots.holds(name)
        if not entry.serving and (not entry.states or not held):
            if self.models.get(key) is entry:  # nothing to show in the index for a folder that does not exist
                self.models.pop(key, None)
            if not held:
                # Triton 2.51's words, with the reason it writes only to its log; 400, not its 500: a name
                # the repository does not hold is the client's mistake, not the server's failure
                raise InvalidArgument(
                    f"failed to load '{name}', failed to poll from model repository: "
                    "model not found in any model repository"
                )
        if failures or not entry.serving:
            kept = f"; still serving version {', '.join(map(str, sorted(entry.serving)))}" if entry.serving else ""
            raise InvalidArgument(
                f"failed to load '{name}': " + ("; ".join(failures) if failures else "no version to serve") + kept
            )

    async def _reconcile(self, entry: ModelEntry, polled: bool = False) -> list[str]:
        """Bring ``entry`` in line with the repository; returns why each failed part failed."""
        name = entry.name
        try:
            root = self._root(entry)
        except NotUnique:
            return self._record_failure(entry, 0, DUPLICATE_REASON)
        if root != entry.repository:
            entry.parsed = None  # another repository's folder: nothing of the last read carries over
        entry.repository = root
        source = await asyncio.to_thread(scan.read_model, root, name, entry.override, entry.parsed, self.config_name)
        if polled and source.missing:
            raise FolderGone(name)
        entry.config_digest = source.config_digest
        entry.parsed = source.parsed
        if source.error or source.config is None:
            return self._record_failure(entry, 0, source.error or "no config")
        config = self._namespace_steps(source.config, root)
        is_ensemble = config.platform == "ensemble"
        wanted = {1: source.config_digest} if is_ensemble else self._wanted(source, config)
        entry.attempted = wanted
        try:
            validate_config(config, name, available_backends())
        except ConfigError as exc:
            return self._record_failure(entry, 0, str(exc))
        targets = list(wanted)
        if not targets:
            entry.states.pop(0, None)
            return self._record_failure(entry, 0, "no version folder with a model file matches the version policy")
        try:
            agents = await asyncio.to_thread(self._run_agents, config, root)
        except (AgentError, ConfigError, ServerError, OSError) as exc:
            return self._record_failure(entry, 0, str(exc))
        entry.states.pop(0, None)
        try:
            failures, loaded = await self._switch(entry, source, config, wanted, targets)
        except BaseException:
            if agents is not None:
                await asyncio.to_thread(agents.loaded, False)
            raise
        if agents is not None or (loaded and entry.agents is not None):
            await asyncio.to_thread(self._agents_after_load, entry, agents, loaded)
        return failures

    def _root(self, entry: ModelEntry) -> Path:
        """The repository ``entry`` is read from: its namespace with namespacing, else the one holding its
        folder (NotUnique: several do)."""
        if self.roots.namespacing and entry.repository is not None:
            return entry.repository
        return self.roots.locate(entry.name)

    def _namespace_steps(self, config: pb.ModelConfig, root: Path) -> pb.ModelConfig:
        """An ensemble's steps given the namespace they are looked up in first (as Triton sets
        ``step.model_namespace``): its own repository with namespacing, none without (Triton's namespace "").
        The scheduler then prefers the member of its own repository, else the only one of that name."""
        if config.platform != "ensemble":
            return config
        namespace = str(root) if self.roots.namespacing else ""
        if all(step.model_namespace == namespace for step in config.ensemble_scheduling.step):
            return config
        copy = pb.ModelConfig()
        copy.CopyFrom(config)
        for step in copy.ensemble_scheduling.step:
            step.model_namespace = namespace
        return copy

    def _run_agents(self, config: pb.ModelConfig, root: Path) -> AgentSession | None:
        """In a worker thread: the config's repository agents told LOAD (AgentError: one refused the model)."""
        session = open_session(root, config, self.repoagent_directory)
        if session is not None:
            try:
                session.load()
            except BaseException:
                session.close()
                raise
        return session

    @staticmethod
    def _agents_after_load(entry: ModelEntry, agents: AgentSession | None, loaded: bool) -> None:
        """In a worker thread: this load's agents told LOAD_COMPLETE (and they replace the serving load's, which
        are told UNLOAD) when a version serves the config just read, else LOAD_FAIL."""
        if not loaded:
            if agents is not None:
                agents.loaded(False)
            return
        if agents is not None:
            agents.loaded(True)
        previous, entry.agents = entry.agents, agents
        if previous is not None:
            previous.unload()

    async def _switch(
        self,
        entry: ModelEntry,
        source: scan.ModelSource,
        config: pb.ModelConfig,
        wanted: dict[int, str],
        targets: list[int],
    ) -> tuple[list[str], bool]:
        """Build the wanted versions and switch the routing table to them: why each failed part failed, and
        whether a version serves the config just read."""
        name = entry.name
        failures: list[str] = []
        failed: set[int] = set()
        new_serving: dict[int, ModelVersion] = {}
        replaced: list[ModelVersion] = []
        for v in targets:
            digest = wanted[v]
            current = entry.serving.get(v)
            if current is not None and current.digest == digest:
                new_serving[v] = current
                continue
            if current is None:
                entry.states[v] = VersionState(ModelState.LOADING)
            try:
                mv = await self._build(config, v, source.versions.get(v), digest, source.path.parent)
            except Exception as exc:  # any load failure is reported, never fatal
                reason = str(exc) if isinstance(exc, (ConfigError, ServerError)) else f"{type(exc).__name__}: {exc}"
                log.error("failed to load '%s' version %s: %s", name, v, reason)
                failures.append(f"version {v}: {reason}")
                failed.add(v)
                if current is not None:
                    new_serving[v] = current  # keep serving what worked
                    entry.states[v] = _serving_state(entry, current, f"reload failed: {reason}")
                else:
                    entry.states[v] = VersionState(ModelState.UNAVAILABLE, reason)
                for hook in self.on_load_failure:
                    hook(name, str(v), reason)
                continue
            new_serving[v] = mv
            if current is not None:
                replaced.append(current)
        if not new_serving and entry.serving:
            # nothing new could load: what was serving stays in place
            return failures, False
        removed = [mv for v, mv in entry.serving.items() if v not in new_serving]
        entry.traffic = parse_traffic(config)  # weights change without a reload (see _wanted)
        entry.serving = new_serving  # the atomic switch
        entry.config = new_serving[max(new_serving)].config if new_serving else config
        for v in new_serving:
            if v not in failed:  # built or kept: it serves the config just read
                entry.states[v] = VersionState(ModelState.READY, "", source.config_digest)
        for mv in removed:
            entry.states[mv.version] = VersionState(ModelState.UNLOADING)
        removed_versions = {mv.version for mv in removed}
        for v in list(entry.states):
            if v not in wanted and v not in removed_versions:
                del entry.states[v]
        # replaced and removed versions take no new requests now; they drain, then unload
        for mv in replaced + removed:
            self._spawn(self._retire(entry, mv, forget=mv in removed))
        return failures, any(v not in failed for v in new_serving)

    async def _build(
        self, config: pb.ModelConfig, version: int, path: Path | None, digest: str, root: Path
    ) -> ModelVersion:
        """Complete the config against this version's model file, then load it.

        The model folder is opened once for the whole load (``repository.model_files``): every file the
        load reads (model file, labels, op libraries, warm-up and initial-state data) is read through it.
        """
        started_at, started = time.time(), time.monotonic()
        vconfig = pb.ModelConfig()
        vconfig.CopyFrom(config)
        folder = await asyncio.to_thread(ModelFolder, root, config.name)
        before = None
        try:
            with folder.loading(path or folder.path / str(version), version):
                backend_cls = await asyncio.to_thread(prepare_config, vconfig, path, self.auto_complete)
                validate_config(vconfig, config.name, available_backends())
                normalize_config(vconfig, range(devices.gpu_count()))
                if self.measure_footprint:  # after the backend's module loaded: that is the process's, not the model's
                    before = await asyncio.to_thread(footprint.measure)
                mv = await build_model_version(
                    vconfig,
                    backend_cls,
                    version,
                    path,
                    digest,
                    self.router,
                    self.listeners,
                    folder,
                    self.response_cache,
                    self.allow_external_op_libraries,
                    self.rate_limiter,
                )
        finally:
            folder.close()
        if before is not None:
            mv.footprint = (await asyncio.to_thread(footprint.measure)).minus(before)
            mv.stats.memory_usage = mv.footprint.memory_usage()
        total = time.monotonic() - started
        self._cold_start(mv, ColdStart(started_at, max(0.0, total - mv.warmup_seconds), mv.warmup_seconds))
        return mv

    def _cold_start(self, mv: ModelVersion, cold: ColdStart) -> None:
        """Keep ``mv``'s cold start, report its load phases now and its first successful request when it comes."""
        mv.cold_start = cold
        name, version = mv.name, mv.version_str
        for phase, seconds in (("load", cold.load_seconds), ("warmup", cold.warmup_seconds)):
            for hook in self.on_load_phase:
                hook(name, version, phase, seconds)

        def first(total_ns: int) -> None:
            if cold.first_inference(total_ns / 1e9, time.time()):
                for hook in self.on_load_phase:
                    hook(name, version, "first_inference", total_ns / 1e9)

        mv.stats.on_first_success = first

    def _record_failure(self, entry: ModelEntry, version: int, reason: str) -> list[str]:
        log.error("model '%s' is unavailable: %s", entry.name, reason)
        if entry.serving:
            # keep serving the last good config; say why the new one was refused
            for v, mv in entry.serving.items():
                entry.states[v] = _serving_state(entry, mv, f"reload failed: {reason}")
        else:
            entry.states = {version: VersionState(ModelState.UNAVAILABLE, reason)}
        for hook in self.on_load_failure:
            hook(entry.name, str(version) if version else "", reason)
        return [reason]

    async def _retire(self, entry: ModelEntry, mv: ModelVersion, forget: bool) -> None:
        drained = await mv.drain(self.drain_timeout)
        if not drained:
            log.warning("unloading %s version %s with requests still in flight", mv.name, mv.version)
        await mv.close()
        state = entry.states.get(mv.version)
        if forget and state is not None and state.state == ModelState.UNLOADING:
            entry.states[mv.version] = VersionState(ModelState.UNAVAILABLE, "unloaded")
        log.info("unloaded %s version %s", mv.name, mv.version)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def unload_model(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        """Stop routing to ``name`` and unload its versions once drained; ``wait=False`` returns right after
        the switch (as Triton's unload, which a model may call on itself without waiting for itself)."""
        check_model_name(name)
        entries = self.named(name)
        if not entries:
            return  # Triton 2.51 answers an unload of a model it does not know with success
        for entry in entries:
            await self._unload_entry(entry, wait)
        if unload_dependents:
            for other in list(self.models.values()):
                if other.config is not None and other.config.platform == "ensemble" and other.serving:
                    steps = {s.model_name for s in other.config.ensemble_scheduling.step}
                    if name in steps:
                        await self.unload_model(other.name, wait=wait)

    def named(self, name: str) -> list[ModelEntry]:
        """The entries of model ``name``: one at most, several with namespacing (one per repository)."""
        if not self.roots.namespacing:
            entry = self.models.get(name)
            return [] if entry is None else [entry]
        return [e for e in self.models.values() if e.name == name]

    async def _unload_entry(self, entry: ModelEntry, wait: bool = True) -> None:
        async with entry.lock:
            retiring = list(entry.serving.values())
            entry.serving = {}
            for mv in retiring:
                entry.states[mv.version] = VersionState(ModelState.UNLOADING)
            entry.override = None
            agents, entry.agents = entry.agents, None
            if wait:
                await asyncio.gather(*(self._retire(entry, mv, forget=True) for mv in retiring))
            else:
                for mv in retiring:
                    self._spawn(self._retire(entry, mv, forget=True))
            if agents is not None:
                await asyncio.to_thread(agents.unload)

    async def forget_model(self, name: str) -> None:
        """Unload and drop from the index (its folder was removed from the repository); ``name``: the entry's
        key (with namespacing its ``identifier``)."""
        entry = self.models.get(name)
        if entry is not None:
            await self._unload_entry(entry)
            if self.models.get(name) is entry:  # not a model of that name loaded anew meanwhile
                self.models.pop(name, None)

    async def load_all(self) -> None:
        """Load every model of the repository, ``load_threads`` at a time (Triton's model-load thread pool)."""
        gate = asyncio.Semaphore(self.load_threads)

        async def one(key: str) -> None:
            async with gate:
                try:
                    await self._load_at(key)
                except ServerError as exc:
                    log.error("%s", exc)

        listing = await asyncio.to_thread(self.roots.listing)
        self._note_duplicates(listing.duplicates)
        await asyncio.gather(*(one(k) for k in sorted(self._found(listing))))

    def _found(self, listing: Listing) -> set[str]:
        """The routing-table keys of the model folders ``listing`` found (names; with namespacing identifiers)."""
        return set(listing.namespaced) if self.roots.namespacing else set(listing.where)

    def _note_duplicates(self, found: set[str]) -> None:
        """Keep the names found in several repositories; Triton's error line for each newly found one."""
        for name in sorted(found - self.duplicates):
            log.error("%s", not_unique(name))
        self.duplicates = set(found)

    def failed_models(self) -> list[str]:
        """One line per model version that failed to load, with the reason (``--exit-on-error``)."""
        failed = []
        for entry in self.models.values():
            for v, s in sorted(entry.states.items()):
                reloading = s.state == ModelState.READY and s.reason.startswith("reload failed")
                if (s.state == ModelState.UNAVAILABLE and s.reason != "unloaded") or reloading:
                    failed.append(entry.name + (f" version {v}" if v else "") + f": {s.reason}")
        failed += [f"{name}: {DUPLICATE_REASON}" for name in sorted(self.duplicates - set(self.models))]
        return failed

    async def poll(self) -> None:
        """Bring the loaded set in line with the repository (poll mode)."""
        listing = await asyncio.to_thread(self.roots.listing)
        for path, exc in listing.unreadable:
            # a repository that vanished (an unmounted volume, a renamed folder) is not "every model deleted":
            # what is loaded keeps serving until the folder is back
            log.warning(
                "model repository %s cannot be read (%s); keeping the %d loaded models until it is back",
                path,
                exc.strerror or exc,
                len(self.models),
            )
        if listing.unreadable and not self.roots.several:
            return
        self._note_duplicates(listing.duplicates)
        on_disk = self._found(listing)
        # a model found in two repositories is unloaded (Triton's poll marks it deleted); with a repository
        # that cannot be read, the others' missing models may be in it: only those are kept
        gone = set(self.models) - on_disk if not listing.unreadable else set(self.models) & listing.duplicates
        for name in sorted(gone):
            await self._gone(name)
        # one thread reads every known folder in turn (a thread per folder made the poll's GIL hand-offs cost
        # more than the reads); only new and changed ones go on to the per-model pass, which reads them again
        known = {name: entry for name in on_disk if (entry := self.models.get(name)) is not None}
        unchanged = await asyncio.to_thread(self._unchanged, known)
        await self.poll_models(sorted(on_disk - unchanged))

    async def poll_models(self, names: list[str]) -> None:
        """What ``poll`` does, now, for these models only (``load_threads`` at a time): a writer of the
        repository (the operator) says which folders it just changed instead of waiting for the next poll."""

        async def one(name: str) -> None:
            async with self._poll_gate:  # shared by the poll loop and every poll request
                await self._poll_one(name)

        if self.roots.namespacing:  # a name stands for its model in every repository (and those known)
            keys: list[str] = []
            for n in names:
                if "/" in n:
                    keys.append(n)
                    continue
                keys += [identifier(root, n) for root in self.roots.holding(n)]
                keys += [k for k, e in self.models.items() if e.name == n]
            names = keys
        await asyncio.gather(*(one(n) for n in dict.fromkeys(names)))

    async def _poll_one(self, name: str) -> None:
        """Load a new or changed model folder; unload one that is gone (an INFO line, not a failed load:
        its writer removed it, e.g. the operator after its InferenceModel was deleted)."""
        entry = self.models.get(name)
        try:
            if self.on_demand and (entry is None or not entry.serving):
                # on demand, a model loads on its next request; a failed load whose files changed is
                # forgotten, so that request tries the new files. Not an entry whose load runs now (the
                # model cache loads outside any poll): that load owns it, the next poll looks again
                if entry is not None and not entry.lock.locked() and await self._changed(entry):
                    if not entry.lock.locked() and self.models.get(name) is entry:
                        self.models.pop(name, None)
                return
            if entry is not None and not await self._changed(entry):
                return
            await self._load_at(name, polled=True)
        except FolderGone:
            await self._gone(name)
        except ServerError as exc:
            log.error("%s", exc)

    async def _gone(self, name: str) -> None:
        entry = self.models.get(name)
        if entry is None or entry.gone:
            return  # unknown, or already being unloaded by another poll
        entry.gone = True
        if entry.serving and name in self.duplicates:
            log.info("model '%s' is in more than one repository now: unloading it", name)
        elif entry.serving:
            log.info("model folder '%s' was removed from the repository: unloading the model", name)
        await self.forget_model(name)

    def _unchanged(self, entries: dict[str, ModelEntry]) -> set[str]:
        """In a worker thread: the names whose folder is as their entry last saw it. A read that races a
        load can only make a folder look changed (the per-model pass then looks again) or unchanged when the
        load already took the change in."""
        same = set()
        for name, entry in entries.items():
            try:
                root = self._root(entry)
                if root != (entry.repository or root):
                    continue  # moved to another repository: the per-model pass loads it from there
                source = scan.read_model(root, entry.name, entry.override, entry.parsed, self.config_name)
                if not source.missing and not self._differs(entry, source):
                    same.add(name)
            except Exception:  # whatever it is, the per-model pass meets it and says so
                continue
        return same

    async def _changed(self, entry: ModelEntry) -> bool:
        try:
            root = self._root(entry)
        except NotUnique:
            raise FolderGone(entry.name) from None  # not served while it is in two repositories
        if root != (entry.repository or root):
            return True  # moved to another repository
        source = await asyncio.to_thread(
            scan.read_model, root, entry.name, entry.override, entry.parsed, self.config_name
        )
        if source.missing:
            raise FolderGone(entry.name)
        entry.parsed = source.parsed or entry.parsed
        return self._differs(entry, source)

    def _differs(self, entry: ModelEntry, source: scan.ModelSource) -> bool:
        """Whether a load now would do something else than the last attempt did."""
        if source.config_digest != entry.config_digest:
            return True
        config = source.config or entry.config  # what _reconcile digests: the config as read, not as normalised
        if config is None or config.platform == "ensemble":
            return False
        return self._wanted(source, config) != entry.attempted

    @staticmethod
    def _wanted(source: scan.ModelSource, config: pb.ModelConfig) -> dict[int, str]:
        """Digest per version the policy selects: what a load would (re)build."""
        targets = select_versions(config, source.versions)
        # the config's digest without its traffic weights: new weights alone reload nothing
        neutral = routing_neutral_digest(config)
        return {v: neutral + ":" + source.version_digests.get(v, "") for v in targets}
