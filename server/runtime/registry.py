"""The model registry: routes (name, version) to a ready ModelVersion; the front door of the runtime.

Routing lives here; loading and unloading in ``lifecycle`` (which swaps what is routed to), the end of
service in ``shutdown``. The registry is what schedulers and backends see as ``RegistryView``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from ..config import pb
from ..observability.stats import StatsListener
from ..repository import scan
from ..vocabulary.custom_metrics import CustomMetrics
from ..vocabulary.errors import InvalidArgument, NotFound, ServerError, Unavailable
from ..vocabulary.registry_view import ModelControl
from ..vocabulary.streaming import ResponseStream
from ..vocabulary.types import InferenceRequest, InferenceResponse
from .cache import ResponseCache
from .lifecycle import ModelEntry, ModelLifecycle, ModelState
from .model import ModelVersion
from .shutdown import GracefulShutdown


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
        auto_complete: bool = True,
        load_threads: int = 4,
        custom_metrics: CustomMetrics | None = None,
        response_cache: ResponseCache | None = None,
        allow_external_op_libraries: bool = True,
    ) -> None:
        self.repository_path = repository_path
        #: metric families Python models create; the metrics endpoint exports them
        self.custom_metrics = custom_metrics if custom_metrics is not None else CustomMetrics()
        self._models: dict[str, ModelEntry] = {}
        #: load/unload as the repository API offers them (the InferenceService sets itself here)
        self.model_control: ModelControl | None = None
        #: the loop requests run on; instance threads call back into it (Python models' BLS)
        self.loop: asyncio.AbstractEventLoop | None = _running_loop()
        self.lifecycle = ModelLifecycle(
            self._models,
            repository_path,
            self,
            listeners if listeners is not None else [],
            drain_timeout,
            auto_complete=auto_complete,
            load_threads=load_threads,
            response_cache=response_cache,
            allow_external_op_libraries=allow_external_op_libraries,
        )
        self._shutdown = GracefulShutdown(self.loop)

    @property
    def on_load_failure(self) -> list[Callable[[str, str, str], None]]:
        """Hooks called with (model, version, reason) when a load fails (metrics)."""
        return self.lifecycle.on_load_failure

    @property
    def shutting_down(self) -> bool:
        return self._shutdown.started

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
        if self._shutdown.started:
            raise Unavailable("server is shutting down")
        mv = self.resolve(request.model_name, request.model_version)
        return await self._shutdown.track(mv.infer(request))

    def infer_stream(self, request: InferenceRequest) -> ResponseStream:
        if self._shutdown.started:
            raise Unavailable("server is shutting down")
        return self.resolve(request.model_name, request.model_version).infer_stream(request)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return self.resolve(name, version).decoupled

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

    def index(self, ready_only: bool = False, names: list[str] | None = None) -> list[dict[str, str]]:
        """Triton's repository index: one row per known version (or per model without versions); with
        ``names``, the rows of those models only (a name neither loaded nor in the repository has none)."""
        rows: list[dict[str, str]] = []
        if names is not None:
            wanted = {n for n in names if n in self._models or (self.repository_path / n).is_dir()}
        else:
            wanted = set(self._models)
            if not ready_only:
                wanted |= set(scan.list_model_names(self.repository_path))
        for name in sorted(wanted):
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
                if s.state == ModelState.READY and s.config_digest:
                    row["config_digest"] = s.config_digest  # kubeinfer's addition to Triton's index rows
                rows.append(row)
        return rows

    # ---- lifecycle (see lifecycle.ModelLifecycle) ------------------------------------------------
    async def load_model(self, name: str, override: pb.ModelConfig | None = None) -> None:
        await self.lifecycle.load_model(name, override)

    async def unload_model(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        await self.lifecycle.unload_model(name, unload_dependents, wait)

    async def load_all(self) -> None:
        await self.lifecycle.load_all()

    def failed_models(self) -> list[str]:
        return self.lifecycle.failed_models()

    async def poll(self) -> None:
        """Bring the loaded set in line with the repository (poll mode)."""
        await self.lifecycle.poll()

    async def poll_models(self, names: list[str]) -> None:
        """``poll`` for these models only, now."""
        await self.lifecycle.poll_models(names)

    async def shutdown(self, timeout: float) -> None:
        """Refuse new requests, let in-flight and queued ones finish (bounded by ``timeout``), then unload.

        Versions already retiring after a reload drain within the same bound (see ``shutdown``).
        """
        everything = [mv for e in self._models.values() for mv in e.serving.values()]
        await self._shutdown.run(everything, self.lifecycle.background, timeout)

    @property
    def abandoned(self) -> list[str]:
        """Versions that did not close within the shutdown timeout (a model stuck in ``execute``)."""
        return self._shutdown.abandoned
