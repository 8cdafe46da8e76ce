"""The model registry: routing (name, version) → ready ModelVersion, and the model lifecycle.

Reload never interrupts service: a new or changed version loads in the background while the old one
serves; the routing table is swapped in one assignment when the new one is ready; the old version
drains its in-flight and queued requests and only then unloads. A failed load leaves what was
serving in place and records the failure (index state/reason, log, metric).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..backends.loader import available_backends
from ..config import ConfigError, pb, validate_config
from ..observability.stats import StatsListener
from ..repository import scan
from ..repository.layout import check_model_name
from ..vocabulary.errors import InvalidArgument, NotFound, ServerError, Unavailable
from ..vocabulary.types import InferenceRequest, InferenceResponse
from .lifecycle import ModelEntry, ModelState, VersionState
from .model import ModelVersion, build_model_version, prepare_config

log = logging.getLogger(__name__)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # built outside a loop (unit tests)
        return None


class ModelRegistry:
    def __init__(
        self,
        repository_path: Path,
        listeners: list[StatsListener] | None = None,
        drain_timeout: float = 300.0,
    ) -> None:
        self.repository_path = repository_path
        self.listeners: list[StatsListener] = listeners if listeners is not None else []
        self.drain_timeout = drain_timeout
        self._models: dict[str, ModelEntry] = {}
        self._background: set[asyncio.Task[Any]] = set()
        #: called with (model, version, reason) when a load fails (metrics hook)
        self.on_load_failure: list[Any] = []
        self.shutting_down = False
        #: tasks inside infer(): the shutdown deadline cancels them into a clean 503 / UNAVAILABLE
        self._requests: set[asyncio.Task[Any]] = set()
        self._expired: set[asyncio.Task[Any]] = set()
        #: the loop requests run on; instance threads call back into it (Python models' BLS)
        self.loop: asyncio.AbstractEventLoop | None = _running_loop()

    # ---- routing -------------------------------------------------------------------------
    def resolve(self, name: str, version: str = "") -> ModelVersion:
        entry = self._models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        serving = entry.serving
        if not version:
            if not serving:
                reason = self._reason(entry)
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions{reason}")
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

    @staticmethod
    def _reason(entry: ModelEntry) -> str:
        reasons = [s.reason for s in entry.states.values() if s.reason]
        return f": {reasons[0]}" if reasons else ""

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self.shutting_down:
            raise Unavailable("server is shutting down")
        mv = self.resolve(request.model_name, request.model_version)
        task = asyncio.current_task()
        # the outermost call owns the task's bookkeeping; a nested call (BLS) leaves it to the outer one
        owner = task if task is not None and task not in self._requests else None
        if owner is not None:
            self._requests.add(owner)
        try:
            return await mv.infer(request)
        except asyncio.CancelledError:
            if task is None or task not in self._expired:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: this cancellation is handled here
                task.uncancel()
            raise Unavailable(
                "server is shutting down: the request did not finish within the shutdown timeout"
            ) from None
        finally:
            if owner is not None:
                self._requests.discard(owner)

    def is_model_ready(self, name: str, version: str = "") -> bool:
        try:
            return self.resolve(name, version).scheduler.ready()
        except ServerError:
            return False

    def model_names(self) -> list[str]:
        return sorted(self._models)

    def ready_versions(self, name: str) -> list[ModelVersion]:
        entry = self._models.get(name)
        return [entry.serving[v] for v in sorted(entry.serving)] if entry else []

    def model_config(self, name: str, version: str = "") -> pb.ModelConfig:
        return self.resolve(name, version).config

    def all_ready(self) -> bool:
        ready = ModelState.READY
        return all(e.serving and all(s.state == ready for s in e.states.values()) for e in self._models.values())

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: one row per known version (or per model without versions)."""
        rows: list[dict[str, str]] = []
        names = set(self._models)
        if not ready_only:
            names |= set(scan.list_model_names(self.repository_path))
        for name in sorted(names):
            entry = self._models.get(name)
            if entry is None:
                rows.append({"name": name})
                continue
            states = dict(entry.states)
            if not states:
                rows.append({"name": name})
            for v in sorted(states):
                s = states[v]
                if ready_only and s.state != ModelState.READY:
                    continue
                row = {"name": name, "version": str(v) if v else "", "state": s.state.value, "reason": s.reason}
                rows.append(row)
        return rows

    # ---- lifecycle -----------------------------------------------------------------------
    async def load_model(self, name: str, override: pb.ModelConfig | None = None) -> None:
        """Load or reload ``name``; ``override`` replaces its config.pbtxt for this load (as Triton).

        Raises InvalidArgument when a selected version failed to load; whatever was serving before
        keeps serving, and the message says so.
        """
        check_model_name(name)
        entry = self._models.get(name)
        if entry is None:
            entry = self._models.setdefault(name, ModelEntry(name))
        async with entry.lock:
            entry.override = override
            failures = await self._reconcile(entry)
        if not entry.serving and (not entry.states or not (self.repository_path / name).is_dir()):
            self._models.pop(name, None)  # nothing to show in the index for a folder that does not exist
        if failures or not entry.serving:
            kept = f"; still serving version {', '.join(map(str, sorted(entry.serving)))}" if entry.serving else ""
            raise InvalidArgument(
                f"failed to load '{name}': " + ("; ".join(failures) if failures else "no version to serve") + kept
            )

    async def _reconcile(self, entry: ModelEntry) -> list[str]:
        """Bring ``entry`` in line with the repository; returns why each failed part failed."""
        name = entry.name
        source = await asyncio.to_thread(scan.read_model, self.repository_path, name, entry.override)
        entry.config_digest = source.config_digest
        if source.error or source.config is None:
            return self._record_failure(entry, 0, source.error or "no config")
        config = source.config
        is_ensemble = config.platform == "ensemble"
        wanted = {1: source.config_digest} if is_ensemble else self._wanted(source, config)
        entry.attempted = wanted
        try:
            validate_config(config, name, available_backends())
        except ConfigError as exc:
            return self._record_failure(entry, 0, str(exc))
        entry.states.pop(0, None)
        targets = list(wanted)
        if not targets:
            return self._record_failure(entry, 0, "no version folder with a model file matches the version policy")
        failures: list[str] = []
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
                mv = await self._build(config, v, source.versions.get(v), digest)
            except Exception as exc:  # any load failure is reported, never fatal
                reason = str(exc) if isinstance(exc, (ConfigError, ServerError)) else f"{type(exc).__name__}: {exc}"
                log.error("failed to load '%s' version %s: %s", name, v, reason)
                failures.append(f"version {v}: {reason}")
                if current is not None:
                    new_serving[v] = current  # keep serving what worked
                    entry.states[v] = VersionState(ModelState.READY, f"reload failed: {reason}")
                else:
                    entry.states[v] = VersionState(ModelState.UNAVAILABLE, reason)
                for hook in self.on_load_failure:
                    hook(name, str(v), reason)
                continue
            new_serving[v] = mv
            entry.states[v] = VersionState(ModelState.READY)
            if current is not None:
                replaced.append(current)
        if not new_serving and entry.serving:
            # nothing new could load: what was serving stays in place
            return failures
        removed = [mv for v, mv in entry.serving.items() if v not in new_serving]
        entry.serving = new_serving  # the atomic switch
        entry.config = new_serving[max(new_serving)].config if new_serving else config
        for mv in removed:
            entry.states[mv.version] = VersionState(ModelState.UNLOADING)
        removed_versions = {mv.version for mv in removed}
        for v in list(entry.states):
            if v not in wanted and v not in removed_versions:
                del entry.states[v]
        # replaced and removed versions take no new requests now; they drain, then unload
        for mv in replaced + removed:
            self._spawn(self._retire(entry, mv, forget=mv in removed))
        return failures

    async def _build(self, config: pb.ModelConfig, version: int, path: Path | None, digest: str) -> ModelVersion:
        """Complete the config against this version's model file, then load it."""
        vconfig = pb.ModelConfig()
        vconfig.CopyFrom(config)
        backend_cls = await asyncio.to_thread(prepare_config, vconfig, path)
        validate_config(vconfig, config.name, available_backends())
        return await build_model_version(
            vconfig, backend_cls, version, path, digest, self, self.listeners, self.repository_path / config.name
        )

    def _record_failure(self, entry: ModelEntry, version: int, reason: str) -> list[str]:
        log.error("model '%s' is unavailable: %s", entry.name, reason)
        if entry.serving:
            # keep serving the last good config; say why the new one was refused
            for v in entry.serving:
                entry.states[v] = VersionState(ModelState.READY, f"reload failed: {reason}")
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

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        check_model_name(name)
        entry = self._models.get(name)
        if entry is None:
            raise NotFound(f"failed to unload '{name}': model is not loaded")
        async with entry.lock:
            retiring = list(entry.serving.values())
            entry.serving = {}
            for mv in retiring:
                entry.states[mv.version] = VersionState(ModelState.UNLOADING)
            entry.override = None
            await asyncio.gather(*(self._retire(entry, mv, forget=True) for mv in retiring))
        if unload_dependents:
            for other in list(self._models.values()):
                if other.config is not None and other.config.platform == "ensemble" and other.serving:
                    steps = {s.model_name for s in other.config.ensemble_scheduling.step}
                    if name in steps:
                        await self.unload_model(other.name)

    async def forget_model(self, name: str) -> None:
        """Unload and drop from the index (its folder was removed from the repository)."""
        if name in self._models:
            await self.unload_model(name)
            self._models.pop(name, None)

    async def load_all(self) -> None:
        for name in scan.list_model_names(self.repository_path):
            try:
                await self.load_model(name)
            except ServerError as exc:
                log.error("%s", exc)

    async def poll(self) -> None:
        """Bring the loaded set in line with the repository (poll mode)."""
        on_disk = set(await asyncio.to_thread(scan.list_model_names, self.repository_path))
        for name in sorted(set(self._models) - on_disk):
            await self.forget_model(name)
        for name in sorted(on_disk):
            entry = self._models.get(name)
            if entry is not None and not await self._changed(entry):
                continue
            try:
                await self.load_model(name)
            except ServerError as exc:
                log.error("%s", exc)

    async def _changed(self, entry: ModelEntry) -> bool:
        source = await asyncio.to_thread(scan.read_model, self.repository_path, entry.name, entry.override)
        if source.config_digest != entry.config_digest:
            return True
        config = entry.config or source.config
        if config is None or config.platform == "ensemble":
            return False
        return self._wanted(source, config) != entry.attempted

    @staticmethod
    def _wanted(source: scan.ModelSource, config: pb.ModelConfig) -> dict[int, str]:
        """Digest per version the policy selects: what a load would (re)build."""
        targets = scan.select_versions(config, list(source.versions))
        return {v: source.config_digest + ":" + source.version_digests.get(v, "") for v in targets}

    async def shutdown(self, timeout: float) -> None:
        """Refuse new requests, let in-flight and queued ones finish (bounded by ``timeout``), then unload.

        Versions already retiring after a reload drain within the same bound. Past it, every request
        still queued or running is answered 503 / UNAVAILABLE instead of being cut off when the
        listeners close.
        """
        self.shutting_down = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        everything = [mv for e in self._models.values() for mv in e.serving.values()]
        drained = await asyncio.gather(*(mv.drain(timeout) for mv in everything))
        if not all(drained):
            # past the bound: what is still queued or running answers 503 / UNAVAILABLE now
            log.warning(
                "shutdown timeout (%.0fs) reached: failing %d unfinished request(s)", timeout, len(self._requests)
            )
            self._expired = set(self._requests)
            for task in self._expired:
                task.cancel()
            await asyncio.gather(*(mv.drain(1.0) for mv in everything))
        if self._background:
            await asyncio.wait(list(self._background), timeout=max(0.0, deadline - loop.time()))
        for task in list(self._background):
            task.cancel()
        for mv in everything:
            try:
                # a batcher's close waits for its queue: give it what is left of the bound, at least 1s
                await asyncio.wait_for(mv.close(), max(1.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                log.warning("%s version %s did not close within the shutdown timeout", mv.name, mv.version)
