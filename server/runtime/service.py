"""The protocol-neutral server API both front ends call: health, metadata, infer, repository, stats."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .. import SERVER_NAME, __version__
from ..config import ConfigError, config_from_dict, config_to_triton_json, pb
from ..observability.logsettings import LogControl
from ..observability.system import process_start_time
from ..observability.trace import Tracer
from ..repository.layout import check_model_name
from ..vocabulary import datatypes
from ..vocabulary.errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable, Unsupported
from ..vocabulary.streaming import ResponseStream
from ..vocabulary.types import InferenceRequest, InferenceResponse
from .deadlines import RequestDeadlines
from .registry import ModelRegistry
from .validation import raw_binary_inputs

log = logging.getLogger(__name__)

EXTENSIONS = [
    "classification",
    "sequence",
    "sequence(string_id)",
    "trace",
    "logging",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
]

CONTROL_NONE, CONTROL_POLL, CONTROL_EXPLICIT = "none", "poll", "explicit"


def load_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """A load request's parameters, refusing Triton's ``file:<path>`` model-file uploads (not offered here).

    Triton writes such parameters as files into a temporary model folder; this server loads only what
    is in its repository, so a request that carries files is refused rather than half-honoured.
    """
    files = sorted(k for k in params if k.startswith("file:"))
    if files:
        raise Unsupported(
            f"load parameters {', '.join(files)}: model files in a load request are not supported by this "
            "server; put the files in the model repository"
        )
    return params


def parse_config_override(raw: Any) -> pb.ModelConfig:
    """A load request's ``config`` parameter (JSON text, or an already parsed object) as a ModelConfig.

    orjson, not ``json``: it refuses JSON nested deeper than 1024 levels with a parse error, where ``json``
    recurses until RecursionError (a 500 for what is the client's mistake)."""
    try:
        data = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"invalid config override: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("parameters.config must be a JSON object (or a string holding one)")
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise InvalidArgument(f"invalid config override: {exc}") from None


@dataclass
class ServiceOptions:
    control_mode: str = CONTROL_NONE
    poll_secs: float = 15.0
    startup_models: tuple[str, ...] = ()
    strict_readiness: bool = False
    #: seconds an inference request may take end to end (0: no limit)
    request_timeout: float = 0.0
    #: server metadata "name" (Triton's --id)
    server_name: str | None = None
    #: extensions the wiring adds (shared memory when --allow-client-shm)
    extensions: tuple[str, ...] = ()
    #: brings the local copy of a cloud repository in line with it (these models; None: every model) before a
    #: poll or a load reads the folder; raises ``Unavailable`` when the repository cannot be read
    refresh: Callable[[list[str] | None], Awaitable[None]] | None = None


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        options: ServiceOptions,
        tracer: Tracer | None = None,
        log_control: LogControl | None = None,
    ) -> None:
        self.registry = registry
        self.options = options
        registry.model_control = self  # models load and unload models through the same checks (BLS)
        #: the trace extension (settings, sampling, the trace file)
        self.tracer = tracer or Tracer()
        #: the logging extension
        self.log_control = log_control or LogControl()
        self.started = False
        #: stopping: responses send their connections away (see close_connections)
        self.closing_connections = False
        self._poller: asyncio.Task[None] | None = None
        #: full repository polls run one at a time (the poll loop's and those asked for)
        self._full_poll = asyncio.Lock()
        #: --request-timeout of the requests in flight
        self._deadlines = RequestDeadlines()
        #: --load-model names that failed in explicit mode (the registry forgets unknown names)
        self._startup_errors: list[str] = []
        #: the process's start, wall-clock seconds: when serving began, its listeners bound and its start-up
        #: loads done (``startup``; the operator shows them per pod in the InferenceServer status)
        self.started_at = process_start_time() or time.time()
        self.listening_at: float | None = None
        self.models_ready_at: float | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        mode = self.options.control_mode
        if mode == CONTROL_EXPLICIT:
            names = self.options.startup_models
            if "*" in names:
                await self.registry.load_all()
            else:
                for name in names:
                    try:
                        await self.registry.load_model(name)
                    except Exception as exc:  # reported in the index; the server still starts
                        log.error("%s", exc)
                        self._startup_errors.append(f"{name}: {exc}")
        else:
            await self.registry.load_all()
        if mode == CONTROL_POLL:
            self._poller = asyncio.create_task(self._poll_forever())
        self.registry.start_background()
        self.started = True
        self.models_ready_at = time.time()

    def startup(self) -> dict[str, float | None]:
        """kubeinfer's start-up timeline (``GET /v2/kubeinfer/startup``): wall-clock seconds since the epoch
        when the server began, listened on its ports, and finished its start-up loads (None: not yet)."""
        return {
            "started_at": self.started_at,
            "listening_at": self.listening_at,
            "models_ready_at": self.models_ready_at,
        }

    def startup_failures(self) -> list[str]:
        """What failed to load at start, one line per model (for ``--exit-on-error``)."""
        failed = self.registry.failed_models()
        named = {line.split(":", 1)[0].split(" version ", 1)[0] for line in failed}
        return failed + [e for e in self._startup_errors if e.split(":", 1)[0] not in named]

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_secs)
            try:
                async with self._full_poll:
                    await self._refresh(None, quiet=True)
                    await self.registry.poll()
            except Exception:  # keep polling whatever one scan hit
                log.exception("repository poll failed")

    async def shutdown(self, timeout: float) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await self.registry.shutdown(timeout)
        self.tracer.flush()

    # ---- health and metadata ------------------------------------------------------------
    def live(self) -> bool:
        return True

    def close_connections(self) -> None:
        """The server is stopping: not ready any more, and the front ends send their connections away
        (HTTP ``Connection: close``; gRPC stops itself) while requests are still answered."""
        self.closing_connections = True

    def ready(self) -> bool:
        if not self.started or self.closing_connections or self.registry.shutting_down:
            return False
        return self.registry.all_ready() if self.options.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return {
            "name": self.options.server_name or SERVER_NAME,
            "version": __version__,
            "extensions": EXTENSIONS + list(self.options.extensions),
        }

    def model_ready(self, name: str, version: str = "") -> bool:
        return not self.registry.shutting_down and self.registry.is_model_ready(name, version)

    async def ensure_loaded(self, name: str, version: str = "") -> None:
        """With the model cache (``--model-load-on-demand``): load ``name`` now if it is not loaded, so that
        metadata, config and stream requests see it as inference requests do (no-op otherwise).

        Triton's own clients ask for a model's metadata and config before its first inference (perf_analyzer,
        the image_client example) and stop on an error, so metadata that answered "not loaded" would make a
        model on demand unusable to them. Such a load is no cheaper to cause than by inference: it goes
        through the same rules (one load per model, the load slots, the budget, the swap limit, the
        abandonment of a load that hangs), and the metadata needs the same token."""
        if self.registry.cache is not None and self.started:
            await self.registry.loaded(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        mv = self.registry.resolve(name, version)
        config = mv.config
        batch = [-1] if config.max_batch_size > 0 else []

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": t.name,
                    "datatype": datatypes.config_to_v2(pb.DataType.Name(t.data_type)),
                    "shape": batch + list(t.dims),
                }
                for t in items
            ]

        versions = [v.version_str for v in self.registry.ready_versions(name)]
        return {
            "name": name,
            "versions": versions,
            "platform": config.platform or config.backend,
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }

    def model_config(self, name: str, version: str = "") -> pb.ModelConfig:
        return self.registry.resolve(name, version).config

    def model_config_json(self, name: str, version: str = "") -> str:
        """The loaded (normalised) config as Triton's ``GET /v2/models/{m}/config`` writes it."""
        return config_to_triton_json(self.model_config(name, version))

    # ---- inference ----------------------------------------------------------------------
    def raw_request(self, name: str, version: str, body: bytes | memoryview) -> InferenceRequest:
        """A request from a raw binary body (HTTP ``Inference-Header-Content-Length: 0``): the model's
        one input with its shape deduced from the byte count; every output is returned."""
        config = self.registry.resolve(name, version).config
        return InferenceRequest(model_name=name, model_version=version, inputs=raw_binary_inputs(config, body))

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        trace_id = self.tracer.sample(request.model_name)
        if not trace_id:
            return await self._infer(request)
        response = None
        try:
            response = await self._infer(request)
            return response
        finally:
            self.tracer.record(trace_id, request, response, time.monotonic_ns())

    async def _infer(self, request: InferenceRequest) -> InferenceResponse:
        if not self.started:
            raise Unavailable("server is not ready: models are still loading")
        timeout = self.options.request_timeout
        # not asyncio.wait_for (a task per request) nor a timer per request: see runtime.deadlines
        deadline = self._deadlines.start(timeout) if timeout else None
        if deadline is None:
            return await self.registry.infer(request)
        try:
            return await self.registry.infer(request)
        except asyncio.CancelledError:
            if not deadline.expired:
                raise
            if hasattr(deadline.task, "uncancel"):  # Python 3.11+: this cancellation is handled here
                deadline.task.uncancel()
            raise DeadlineExceeded(
                f"request for model '{request.model_name}' did not finish within the server's request timeout "
                f"of {timeout:g}s (--request-timeout)"
            ) from None
        finally:
            self._deadlines.finish(deadline)

    def infer_stream(self, request: InferenceRequest) -> ResponseStream:
        """Start ``request`` on any model; its responses (one for a non-decoupled model) come on the stream."""
        if not self.started:
            raise Unavailable("server is not ready: models are still loading")
        return self.registry.infer_stream(request)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        return self.registry.is_decoupled(name, version)

    # ---- trace and logging extensions ----------------------------------------------------
    def _known_model(self, model: str) -> None:
        if model and model not in self.registry.model_names():
            raise NotFound(f"Request for unknown model: '{model}' is not found")

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        self._known_model(model)
        return self.tracer.settings(model)

    def update_trace_settings(self, updates: dict[str, Any], model: str = "") -> dict[str, Any]:
        self._known_model(model)
        return self.tracer.update(updates, model)

    def log_settings(self) -> dict[str, Any]:
        return self.log_control.settings()

    def update_log_settings(self, updates: dict[str, Any]) -> dict[str, Any]:
        return self.log_control.update(updates)

    # ---- statistics ---------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if not name:
            stats = [mv.stats.as_dict() for n in self.registry.model_names() for mv in self.registry.ready_versions(n)]
            return {"model_stats": stats}
        versions = self.registry.ready_versions(name)
        if not versions:
            # Triton (2.51, HTTP 400 / INVALID_ARGUMENT): "requested model 'nope' is not available"
            raise InvalidArgument(f"requested model '{name}' is not available")
        if version:
            return {"model_stats": [self.registry.resolve(name, version).stats.as_dict()]}
        return {"model_stats": [mv.stats.as_dict() for mv in versions]}

    # ---- repository ---------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.registry.index(ready_only)

    async def poll_repository(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """kubeinfer's repository poll (poll mode only): bring these models (every model when ``names`` is
        None) in line with the repository now, as the next poll would, and return their index rows.

        For a writer of the repository (the operator) that knows which folders it just changed: the server
        loads them (or unloads them, their folder removed) at once instead of at its next poll. It changes
        nothing the repository does not already say, so it is allowed wherever the index may be read.
        """
        if self.options.control_mode != CONTROL_POLL:
            raise Unavailable(
                f"a repository poll needs --model-control-mode=poll (this server runs in "
                f"{self.options.control_mode!r} mode: load and unload models instead)"
            )
        if names is None:
            async with self._full_poll:  # one full scan at a time, however many callers ask
                await self._refresh(None)
                await self.registry.poll()
            return self.registry.index()
        for name in names:
            check_model_name(name)
        await self._refresh(names)
        await self.registry.poll_models(names)
        return self.registry.index(names=names)

    def _check_explicit(self) -> None:
        if self.options.control_mode != CONTROL_EXPLICIT:
            # Triton's status and words (core ModelRepositoryManager::LoadUnloadModel), in "none" mode too
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load_with_parameters(self, name: str, parameters: Mapping[str, Any]) -> None:
        """A load request as the repository API gets it: ``config`` (JSON text or object) overrides
        config.pbtxt; ``file:<path>`` parameters are refused (see ``load_parameters``)."""
        self._check_explicit()
        params = load_parameters(dict(parameters))
        await self.load_model(name, parse_config_override(params["config"]) if "config" in params else None)

    async def load_model(self, name: str, config_override: pb.ModelConfig | None = None) -> None:
        self._check_explicit()
        if config_override is not None and config_override.name and config_override.name != name:
            raise InvalidArgument(
                f"config override names model '{config_override.name}' but the request loads '{name}'"
            )
        await self._refresh([name])
        await self.registry.load_model(name, config_override)

    async def _refresh(self, names: list[str] | None, quiet: bool = False) -> None:
        """The cloud repository's local copy brought up to date first (Triton localizes a model on load); a
        poll that cannot read the repository keeps serving the copy it has (``quiet``: logged only)."""
        if self.options.refresh is None:
            return
        try:
            await self.options.refresh(names)
        except Unavailable:
            if not quiet:
                raise
            log.warning("cloud repository not readable; serving the local copy", exc_info=True)

    async def unload_model(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        self._check_explicit()
        await self.registry.unload_model(name, unload_dependents, wait)
