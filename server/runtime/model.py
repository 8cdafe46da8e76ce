"""A loaded, servable model version and how one is built from the repository."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from ..backends.base import Backend, InstanceSpec
from ..backends.loader import load_backend_class
from ..config import ConfigError, pb
from ..observability.stats import ModelStats, StatsListener
from ..repository.layout import op_library_path
from ..repository.model_files import ModelFolder
from ..scheduling.base import Scheduler
from ..scheduling.factory import make_scheduler
from ..scheduling.instance_pool import InstancePool
from ..scheduling.rate_limiter import RateLimiter
from ..vocabulary.classification import parse_labels
from ..vocabulary.errors import (
    BackendError,
    Cancelled,
    DecoupledModelCall,
    ServerError,
    Unavailable,
)
from ..vocabulary.registry_view import RegistryView
from ..vocabulary.streaming import ResponseStream
from ..vocabulary.types import InferenceRequest, InferenceResponse
from .cache import ResponseCache, request_key
from .cold_start import ColdStart
from .footprint import Footprint
from .reshape import Reshaper
from .validation import RequestValidator, check_outputs
from .warmup import warm_up

log = logging.getLogger(__name__)


def instance_specs(config: pb.ModelConfig) -> list[InstanceSpec]:
    """Expand a normalised ``instance_group`` (``config.normalize``: names, kinds, counts and gpus filled
    in) into concrete slots: ``count`` per group, per listed GPU for KIND_GPU groups.

    An instance is named ``<group>_<index in its group>`` as Triton names it (``add_sub_0``,
    ``add_sub_0_1``).
    """
    specs: list[tuple[str, str, int]] = []
    for group in config.instance_group:
        kind = pb.ModelInstanceGroup.Kind.Name(group.kind).removeprefix("KIND_")
        if kind == "GPU":
            for gpu in group.gpus:
                specs += [(group.name, kind, gpu)] * group.count
        else:
            specs += [(group.name, kind, 0)] * group.count
    in_group: dict[str, int] = {}
    result = []
    for i, (n, k, d) in enumerate(specs):
        k_in_group = in_group[n] = in_group.get(n, -1) + 1
        result.append(
            InstanceSpec(name=n, kind=k, device_id=d, index=i, total=len(specs), instance_name=f"{n}_{k_in_group}")
        )
    return result


def prepare_config(
    config: pb.ModelConfig, version_path: Path | None, auto_complete: bool = True
) -> type[Backend] | None:
    """Auto-complete (unless ``--disable-auto-complete-config``) and check ``config`` in place against the
    model file; returns the backend class."""
    if config.platform == "ensemble":
        return None
    backend_cls = load_backend_class(config)
    if version_path is not None:
        if auto_complete:
            backend_cls.auto_complete_config(config, version_path)
        backend_cls.validate_model(config, version_path)
    return backend_cls


class ModelVersion:
    """One ready model version: its scheduler, instances, statistics and in-flight count.

    Two ways in: ``infer`` (one request, one response: HTTP ``/infer``, gRPC ``ModelInfer``, BLS
    ``exec()``) and ``infer_stream`` (responses on a ``ResponseStream``: gRPC ``ModelStreamInfer``, HTTP
    ``generate``, BLS ``exec(decoupled=True)``). A decoupled model is reachable only through the second,
    as in Triton. A request in flight either way keeps the version from unloading until it is answered.
    """

    def __init__(
        self,
        config: pb.ModelConfig,
        version: int,
        scheduler: Scheduler,
        pool: InstancePool | None,
        stats: ModelStats,
        digest: str,
        labels: dict[str, list[str]] | None = None,
        cache: ResponseCache | None = None,
        checks_outputs: bool = True,
    ) -> None:
        """``checks_outputs``: outputs must match the config's datatype and dims (the backend's
        ``Backend.checks_outputs``)."""
        self.config = config
        #: the server's response cache, when this version uses it (response_cache { enable: true })
        self.cache = cache
        self.uses_cache = cache is not None
        self.name = config.name
        self.version = version
        self.version_str = str(version)
        self.scheduler = scheduler
        self.pool = pool
        self.stats = stats
        self.digest = digest
        self.labels = labels or {}
        self.validator = RequestValidator(config, checks_outputs)
        #: the config's ``reshape``s, applied here for every backend as Triton core does (``runtime.reshape``)
        self.reshaper = Reshaper(config)
        self._reshapes_inputs = bool(self.reshaper.inputs)
        self._reshapes_outputs = bool(self.reshaper.outputs)
        self.decoupled = config.model_transaction_policy.decoupled
        self.inflight = 0
        #: memory its load took (measured when loads do not overlap: the model cache)
        self.footprint: Footprint | None = None
        #: seconds its warm-up samples took (part of its build)
        self.warmup_seconds = 0.0
        #: its cold start, phase by phase (set by the lifecycle that built it)
        self.cold_start: ColdStart | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.closed = False

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self.closed:
            raise Unavailable(f"model '{self.name}' version {self.version} is unloading")
        if self.decoupled:
            raise DecoupledModelCall(f"model '{self.name}' is decoupled: it answers through a response stream")
        if not self.inflight:  # only the first request in flight un-sets "idle" (no Event call per request)
            self._idle.clear()
        self.inflight += 1
        try:
            try:
                self.validator.validate(request)
                if self._reshapes_inputs:
                    request.inputs = self.reshaper.model_inputs(request.inputs)
                if self.cache is not None:
                    return await self._infer_cached(request, self.cache)
                outputs = await self.scheduler.submit(request)
                if outputs is None:
                    raise BackendError(f"model '{self.name}' sent its response to a stream nobody reads")
                if self._reshapes_outputs:
                    outputs = self.reshaper.client_outputs(outputs)
                check_outputs(self.validator, outputs)
            except ServerError as exc:
                self.stats.record_request(request, False, exc.failure_reason)
                raise
            except asyncio.CancelledError:  # the client went away (gRPC cancel, closed connection)
                request.cancelled = True
                self.stats.record_request(request, False, "CANCELED")
                raise
            except Exception as exc:  # a backend bug must not take the server down
                log.exception("model %s version %s failed", self.name, self.version)
                self.stats.record_request(request, False, "BACKEND")
                raise BackendError(f"model '{self.name}' failed: {type(exc).__name__}: {exc}") from exc
            self.stats.record_request(request, True)
            return InferenceResponse(self.name, self.version_str, outputs, request.id, labels=self.labels)
        finally:
            self._done()

    def infer_stream(self, request: InferenceRequest) -> ResponseStream:
        """Start ``request``; its responses arrive on the returned stream, the last one marked final.

        A non-decoupled model's one answer (or error) becomes the stream's single final item. Cancelling
        the stream while the request still waits for an instance drops it unexecuted.
        """
        if self.closed:
            raise Unavailable(f"model '{self.name}' version {self.version} is unloading")
        self.validator.validate(request)
        if self._reshapes_inputs:
            request.inputs = self.reshaper.model_inputs(request.inputs)
        stream = ResponseStream(request, self.name, self.version_str)
        if self.decoupled:
            request.stream = stream
            if self._reshapes_outputs:  # the model sends its responses itself, each reshaped on its way
                stream.shape_outputs = self.reshaper.client_outputs
        if not self.inflight:
            self._idle.clear()
        self.inflight += 1
        task = asyncio.get_running_loop().create_task(self._run_stream(request, stream))

        def cancel_if_queued() -> None:
            if not request.compute_start_ns and not task.done():
                task.cancel()

        stream.on_cancel(cancel_if_queued)
        return stream

    async def _run_stream(self, request: InferenceRequest, stream: ResponseStream) -> None:
        try:
            try:
                outputs = await self.scheduler.submit(request)
                if outputs is not None and stream.shape_outputs is None:  # else ``send`` reshapes them
                    if self._reshapes_outputs:
                        outputs = self.reshaper.client_outputs(outputs)
                    check_outputs(self.validator, outputs)
            except ServerError as exc:
                self.stats.record_request(request, False, exc.failure_reason)
                stream.fail(exc)
                return
            except asyncio.CancelledError:  # cancelled while queued: it never executes
                self.stats.record_request(request, False, "CANCELED")
                stream.fail(Cancelled("Request was cancelled"))
                return
            except Exception as exc:  # a backend bug must not take the server down
                log.exception("model %s version %s failed", self.name, self.version)
                self.stats.record_request(request, False, "BACKEND")
                stream.fail(BackendError(f"model '{self.name}' failed: {type(exc).__name__}: {exc}"))
                return
            if outputs is not None:
                stream.send(outputs, final=True)
            elif not stream.finished:  # the backend is done with the request: the stream ends
                stream.send(None, final=True)
            self.stats.record_request(request, True)
        finally:
            self._done()

    def _done(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def _infer_cached(self, request: InferenceRequest, cache: ResponseCache) -> InferenceResponse:
        """Answer from the cache, or execute and store (Triton's cache_hit / cache_miss statistics)."""
        start = time.perf_counter_ns()
        key = request_key(request, self.version_str)
        # a remote (redis) cache does network I/O: in a thread, never on the event loop; the local one is a dict
        outputs = await asyncio.to_thread(cache.lookup, key) if cache.remote else cache.lookup(key)
        lookup_ns = time.perf_counter_ns() - start
        if outputs is not None:
            self.stats.record_cache(True, lookup_ns)
        else:
            outputs = await self.scheduler.submit(request)
            if outputs is None:
                raise BackendError(f"model '{self.name}' sent its response to a stream nobody reads")
            if self._reshapes_outputs:
                outputs = self.reshaper.client_outputs(outputs)
            check_outputs(self.validator, outputs)  # a wrong answer is never cached
            insert_start = time.perf_counter_ns()
            if cache.remote:  # awaited, as Triton inserts before responding: the next identical request hits
                await asyncio.to_thread(cache.insert, key, outputs)
            else:
                cache.insert(key, outputs)
            self.stats.record_cache(False, lookup_ns + time.perf_counter_ns() - insert_start)
        self.stats.record_request(request, True)
        return InferenceResponse(self.name, self.version_str, outputs, request.id, labels=self.labels)

    async def drain(self, timeout: float | None = None) -> bool:
        """Wait until no request is in flight; True when drained within ``timeout``."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        self.closed = True
        await self.scheduler.close()
        if self.pool is not None:
            await asyncio.to_thread(self.pool.close)


async def build_model_version(
    config: pb.ModelConfig,
    backend_cls: type[Backend] | None,
    version: int,
    version_path: Path | None,
    digest: str,
    registry: RegistryView,
    listeners: list[StatsListener],
    model_dir: ModelFolder | None = None,
    cache: ResponseCache | None = None,
    allow_external_op_libraries: bool = True,
    rate_limiter: RateLimiter | None = None,
) -> ModelVersion:
    """Load every instance (off the loop), then start the scheduler; ``model_dir`` is the model's folder,
    opened for this load (every file it reads is read through it); ``allow_external_op_libraries``:
    ``--allow-external-op-libraries`` (see ``_op_libraries``)."""
    stats = ModelStats(config.name, str(version), listeners)
    for listener in listeners:  # the metrics read the version's config.pbtxt model_metrics (histogram buckets)
        on_config = getattr(listener, "on_version_config", None)
        if on_config is not None:
            on_config(config.name, str(version), config)
    warmup_seconds = 0.0
    labels = {t.name: _labels(model_dir, t) for t in config.output if t.label_filename and model_dir is not None}
    op_libraries = _op_libraries(config, backend_cls, model_dir, allow_external_op_libraries)
    pool = None
    if backend_cls is not None:
        assert version_path is not None
        specs = instance_specs(config)

        def load() -> InstancePool:
            backend = backend_cls(config, version_path, version, registry)
            backend.op_libraries = op_libraries
            instances = []
            try:
                for spec in specs:
                    instances.append(backend.create_instance(spec))
            except BaseException:
                for inst in instances:
                    inst.close()
                raise
            return InstancePool(instances, stats, f"{config.name}-v{version}", rate_limiter, tickets)

        groups = {g.name: g.rate_limiter for g in config.instance_group}
        # raises Triton's error when the resources cannot serve the instances (``rate_limiter.py``)
        limits = [(groups[s.name], s.device_id) for s in specs]
        tickets = rate_limiter.register(config.name, limits) if rate_limiter is not None else None
        started = time.monotonic()
        try:
            pool = await asyncio.to_thread(load)
        except BaseException:
            if rate_limiter is not None and tickets is not None:
                rate_limiter.unregister(tickets)
            raise
        log.info(
            "loaded %s version %s (%d instances) in %.2fs", config.name, version, pool.size, time.monotonic() - started
        )
        if config.model_warmup:
            started = time.monotonic()
            try:
                await warm_up(config, version, pool, model_dir)
            except BaseException:
                await asyncio.to_thread(pool.close)
                raise
            warmup_seconds = time.monotonic() - started
    scheduler = make_scheduler(config, pool, registry, model_dir)
    await scheduler.start()
    checks_outputs = backend_cls.checks_outputs if backend_cls is not None else True
    mv = ModelVersion(
        config, version, scheduler, pool, stats, digest, labels, _cache_for(config, cache), checks_outputs
    )
    mv.warmup_seconds = warmup_seconds
    return mv


def _labels(model_dir: ModelFolder, output: pb.ModelOutput) -> list[str]:
    """An output's ``label_filename``, read beneath the repository (labels may be shared between its models)."""
    try:
        data = model_dir.read(output.label_filename, f"output '{output.name}' label file", own=False)
    except OSError as exc:
        raise ConfigError(f"cannot read label file {output.label_filename}: {exc.strerror or exc}") from None
    return parse_labels(data, output.label_filename)


def _op_libraries(
    config: pb.ModelConfig,
    backend_cls: type[Backend] | None,
    model_dir: ModelFolder | None,
    allow_external: bool = True,
) -> list[Path]:
    """``model_operations.op_library_filename`` resolved (``layout.op_library_path``) for a backend that loads
    custom-op libraries (onnxruntime); any other backend ignores the field, as Triton does (its TensorRT
    and PyTorch custom ops are LD_PRELOADed into the server), with one warning.

    Triton loads an absolute path from anywhere; ``allow_external`` False (``--allow-external-op-libraries
    =false``, for a pool shared by teams) refuses every library outside the model's own folder, so a model
    can only run code it ships itself.

    A library in the model's folder is then read through the folder's descriptor and handed over as a
    private copy (``ModelFolder.library``): what ``dlopen`` maps is the file that was checked."""
    entries = list(config.model_operations.op_library_filename)
    if not entries:
        return []
    if backend_cls is None or not backend_cls.loads_op_libraries:
        served_by = f"platform '{config.platform}'" if config.platform else f"backend '{config.backend}'"
        log.warning(
            "model '%s': model_operations op_library_filename is ignored for %s: as in Triton, only the "
            "onnxruntime backend loads op libraries (load other custom ops into the server with LD_PRELOAD)",
            config.name,
            served_by,
        )
        return []
    assert model_dir is not None
    own = model_dir.real_path()
    libraries = []
    for entry in entries:
        real = op_library_path(model_dir.path, entry)
        if real.is_relative_to(own):
            real = model_dir.library(str(real.relative_to(own)), "model_operations op_library_filename")
        elif not allow_external:
            raise ConfigError(
                f"model_operations op_library_filename '{entry}' is outside the model's folder, and this "
                "server refuses op libraries from outside it (--allow-external-op-libraries=false): put the "
                "library in the model's folder and name it without a path"
            )
        libraries.append(real)
    return libraries


def _cache_for(config: pb.ModelConfig, cache: ResponseCache | None) -> ResponseCache | None:
    """The response cache when this model may use it (docs/user_guide/response_cache.md "Known Limitations")."""
    if not config.response_cache.enable:
        return None
    reason = ""
    if cache is None or not cache.enabled:
        reason = "the server has no response cache (start it with --cache-config local,size=<bytes>)"
    elif config.WhichOneof("scheduling_choice") in ("sequence_batching", "ensemble_scheduling"):
        reason = "sequence-batched models and ensembles are not cached"
    elif config.model_transaction_policy.decoupled:
        reason = "decoupled models are not cached"
    if reason:
        log.warning("model '%s' enables response_cache but is not cached: %s", config.name, reason)
        return None
    return cache
