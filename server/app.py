"""Process wiring: one event loop runs HTTP, gRPC and metrics over one InferenceService.

Shutdown (SIGTERM/SIGINT): readiness turns false at once and new inference requests get 503;
in-flight and queued requests finish (bounded by ``--shutdown-timeout``); then the listeners close
and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn

from .backends import loader as backend_loader
from .backends import settings as backend_settings
from .grpc.settings import Keepalive
from .observability.latencies import MetricsConfig
from .observability.logsettings import LogControl
from .observability.metrics import TritonMetrics
from .observability.trace import Tracer
from .repository.agents import DEFAULT_DIRECTORY as DEFAULT_REPOAGENT_DIRECTORY
from .repository.roots import RepositorySet
from .runtime.auth import BearerToken, TlsFiles
from .runtime.cache import ResponseCache
from .runtime.model_cache import CacheSettings
from .runtime.redis_cache import RedisCacheError, RedisConfig, RedisResponseCache
from .runtime.registry import ModelRegistry
from .runtime.service import InferenceService, ServiceOptions
from .scheduling.rate_limiter import RateLimiter
from .sharedmemory import SharedMemoryRegistry
from .sharedmemory.cuda import cuda_available
from .vocabulary.errors import Unavailable
from .vocabulary.limits import DEFAULT_LIMITS, Limits
from .vocabulary.server_defaults import GRPC_PORT, HTTP_PORT, METRICS_PORT, SHUTDOWN_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from .grpc.transport import GrpcListener

log = logging.getLogger("kubeinfer.server")


@dataclass
class ServerSettings:
    model_repository: Path
    #: the other ``--model-repository`` folders, after the first (models merged across all: ``repository.roots``)
    more_repositories: tuple[Path, ...] = ()
    #: --model-namespacing=true: the same model name in several repositories is several models (``repository.roots``)
    model_namespacing: bool = False
    #: ``s3://...``: ``model_repository`` is its local copy, synced before serving and before every poll or load
    cloud_repository: str | None = None
    host: str = "0.0.0.0"
    #: per-listener bind addresses (Triton's --http-address/--grpc-address/--metrics-address); "" = host
    http_host: str = ""
    grpc_host: str = ""
    metrics_host: str = ""
    http_port: int | None = HTTP_PORT
    grpc_port: int | None = GRPC_PORT
    metrics_port: int | None = METRICS_PORT
    #: the OpenAI-compatible listener (--openai-port; None: off, the default) and its address ("" = host)
    openai_port: int | None = None
    openai_host: str = ""
    #: Triton's SageMaker listener (--allow-sagemaker, --sagemaker-port; None: off); see http/sagemaker.py
    sagemaker_port: int | None = None
    #: Triton's Vertex AI listener (--allow-vertex-ai, --vertex-ai-port; None: off), its default model
    #: (--vertex-ai-default-model; "": the only ready one) and routes ($AIP_PREDICT_ROUTE, $AIP_HEALTH_ROUTE)
    vertex_ai_port: int | None = None
    vertex_ai_default_model: str = ""
    vertex_ai_routes: tuple[str, str] = ("", "")
    control_mode: str = "none"
    poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    strict_readiness: bool = False
    #: exit with status 1 when a model fails to load at start (Triton's --exit-on-error)
    exit_on_error: bool = False
    #: fill inputs/outputs/max_batch_size from model files (off: --disable-auto-complete-config)
    auto_complete: bool = True
    #: --model-config-name: read <model>/configs/<name>.pbtxt where it exists ("" : config.pbtxt only)
    model_config_name: str = ""
    #: --repoagent-directory: named where a config's repository agent is not found (repository.agents)
    repoagent_directory: str = DEFAULT_REPOAGENT_DIRECTORY
    load_threads: int = 4
    #: --backend-config, {backend or "": {setting: value}}
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    #: --allowed-backends: the only backends models may use (None: all)
    allowed_backends: tuple[str, ...] | None = None
    #: --rate-limit=execution_count, and --rate-limit-resource as (name, count, device or -1)
    rate_limit: bool = False
    rate_limit_resources: tuple[tuple[str, int, int], ...] = ()
    #: server metadata name (Triton's --id); None = "kubeinfer"
    server_name: str | None = None
    #: clients may register and use shared-memory regions (Triton's --allow-client-shm, default false)
    allow_client_shm: bool = False
    #: models may load op libraries from outside their own folder (absolute paths; Triton: yes)
    allow_external_op_libraries: bool = True
    #: bytes of the local response cache (--cache-config local,size=N); 0 = no cache
    response_cache_bytes: int = 0
    #: Triton's redis response cache instead (--cache-config redis,host=H --cache-config redis,port=P ...)
    response_cache_redis: RedisConfig | None = None
    #: models on demand within a memory budget (--model-load-on-demand, --model-cache-memory-budget, ...)
    model_cache: CacheSettings | None = None
    #: the trace extension's settings at start (--trace-config)
    trace_settings: dict[str, Any] = field(default_factory=dict)
    #: Triton's latency metric families (--metrics-config)
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    #: the logging extension's control, configured by the command line (None: defaults)
    log_control: LogControl | None = None
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_SECONDS
    #: after SIGTERM, seconds of answering while sending connections to other replicas (see ServerProcess.drain)
    connection_drain_seconds: float = 0.0
    #: milliseconds after which gRPC connections get a graceful GOAWAY (0: never; see start_grpc_server)
    grpc_max_connection_age_ms: int = 0
    #: --grpc-max-connection-age-grace (0: none)
    grpc_max_connection_age_grace_ms: int = 0
    #: HTTP/2 keepalive and ping policy (Triton's flags)
    grpc_keepalive: Keepalive = field(default_factory=Keepalive)
    #: what serves the gRPC listener: "rust", "grpcio" or "auto" (see grpc/transport.py)
    grpc_transport: str = "auto"
    #: what serves the HTTP listener: "native", "asgi" or "auto" (see http/transport.py)
    http_transport: str = "auto"
    limits: Limits = DEFAULT_LIMITS
    #: bearer token file checked on HTTP and gRPC (None: no authentication)
    auth_token_file: Path | None = None
    #: TLS (mTLS with a client CA) on the HTTP and gRPC listeners (None: plain)
    http_tls: TlsFiles | None = None
    grpc_tls: TlsFiles | None = None
    log_level: str = "info"


class HttpListener(Protocol):
    """What ServerProcess uses of an HTTP listener: uvicorn's server (``_Uvicorn``) or the native transport's
    (``http.native.NativeHttpServer``)."""

    started: bool
    should_exit: bool
    config: Any  # its ``port``

    async def serve(self) -> None: ...


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: this process decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _uvicorn(app: Any, host: str, port: int, log_level: str, limits: Limits, tls: TlsFiles | None = None) -> _Uvicorn:
    limit_concurrency = None
    try:
        from .http.infer_route import InferRoute
        from .http.protocol import bounded_protocol

        route = app if isinstance(app, InferRoute) else None
        http: Any = bounded_protocol(limits, route)
        if route is not None:
            log.info(
                "HTTP inference on port %d: the direct path answers plain requests inside uvicorn %s's httptools "
                "protocol; chunked, compressed or unauthenticated ones take the ASGI route "
                "(the counter kubeinfer_http_infer_requests{path} says how many each)",
                port,
                uvicorn.__version__,
            )
    except ImportError as exc:  # no httptools: uvicorn's h11 protocol, bounded by h11_max_incomplete_event_size
        http = "h11"
        limit_concurrency = limits.http_max_connections or None  # uvicorn's own 503 (plain text)
        log.warning(
            "HTTP on port %d: uvicorn's h11 protocol and the ASGI route serve every request, because the direct "
            "path cannot load (%s); --http-header-timeout and --http-body-timeout are not enforced on it",
            port,
            exc,
        )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=http,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        loop="none",
        lifespan="off",
        access_log=False,
        log_level="warning" if log_level == "info" else log_level,
        timeout_keep_alive=75,
        limit_concurrency=limit_concurrency,
        # after the runtime drained (bounded by --shutdown-timeout), responses still being written get
        # this long; then uvicorn cancels what is left instead of waiting forever
        timeout_graceful_shutdown=5,
        ssl_certfile=str(tls.cert) if tls else None,
        ssl_keyfile=str(tls.key) if tls else None,
        ssl_ca_certs=str(tls.client_ca) if tls and tls.client_ca else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.client_ca else ssl.CERT_NONE,
    )
    return _Uvicorn(config)


async def _cloud_repository(uri: str, local: Path) -> Callable[[list[str] | None], Awaitable[None]] | None:
    """Copy the cloud repository ``uri`` into ``local`` (every model, as Triton localizes them) and return what
    syncs it again before a poll or a load; None (logged in Triton's words) when it cannot be read."""
    # the stores' libraries (botocore, google-auth, azure-storage-blob) only for a cloud repository
    from .sources.mirror import CloudRepository, RepositoryUnavailable

    try:
        # (finding credentials may ask a metadata server: off the event loop)
        mirror = await asyncio.to_thread(CloudRepository, uri, local)
        await asyncio.to_thread(mirror.sync)
    except RepositoryUnavailable as exc:
        # Triton's words: its repository manager's poll error, then the server's creation failing
        log.error("failed to poll model repository '%s': %s", uri, exc)
        log.error("error: creating server: Internal - failed to load all models")
        return None
    log.info("cloud repository %s copied to %s", uri, local)

    async def refresh(names: list[str] | None) -> None:
        try:
            await asyncio.to_thread(mirror.sync, names)
        except RepositoryUnavailable as exc:
            raise Unavailable(str(exc)) from None

    return refresh


class ServerProcess:
    """One server process's life, in the order ``serve`` runs its phases: ``build`` (the service and what it
    needs, nothing listening yet), ``start`` (listeners, then models), ``until_stopped`` (SIGTERM or SIGINT),
    ``drain`` (clients sent elsewhere, in-flight requests finished) and ``stop`` (listeners closed).

    A phase uses what the ones before it made: call them in that order, each once."""

    # made by build()
    shm: SharedMemoryRegistry
    metrics: TritonMetrics
    registry: ModelRegistry
    service: InferenceService
    token: BearerToken | None

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.servers: list[HttpListener] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.grpc_server: GrpcListener | None = None
        self._grpc_stopped: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._stop_wait: asyncio.Task[Any] | None = None

    async def build(self) -> bool:
        """Backends' settings, the response cache, the cloud repository's first copy, the registry and the
        service, and the signal handlers; False (logged) when the process cannot serve (exit status 1)."""
        settings = self.settings
        backend_settings.configure(settings.backend_config)
        backend_loader.allow_only(list(settings.allowed_backends) if settings.allowed_backends is not None else None)
        self.shm = SharedMemoryRegistry(enabled=settings.allow_client_shm)
        extensions: tuple[str, ...] = ()
        if settings.allow_client_shm:
            extensions = ("system_shared_memory",) + (("cuda_shared_memory",) if not cuda_available() else ())
        self.metrics = metrics = TritonMetrics(config=settings.metrics_config)
        cache = ResponseCache(settings.response_cache_bytes) if settings.response_cache_bytes > 0 else None
        if settings.response_cache_redis is not None:
            cache = RedisResponseCache(settings.response_cache_redis)
            try:
                await asyncio.to_thread(cache.connect)  # Triton PINGs Redis and does not start without it
            except RedisCacheError as exc:
                log.error("%s", exc)
                return False
        metrics.response_cache = cache
        refresh = None
        if settings.cloud_repository:
            refresh = await _cloud_repository(settings.cloud_repository, settings.model_repository)
            if refresh is None:
                return False
        registry = ModelRegistry(
            RepositorySet([settings.model_repository, *settings.more_repositories], settings.model_namespacing)
            if settings.more_repositories
            else settings.model_repository,
            listeners=[metrics],
            auto_complete=settings.auto_complete,
            load_threads=settings.load_threads,
            response_cache=cache,
            allow_external_op_libraries=settings.allow_external_op_libraries,
            model_cache=settings.model_cache,
            model_config_name=settings.model_config_name,
            repoagent_directory=settings.repoagent_directory,
        )
        if settings.rate_limit:
            registry.lifecycle.rate_limiter = RateLimiter(settings.rate_limit_resources)
        registry.on_load_failure.append(metrics.on_load_failure)
        registry.on_load_phase.append(metrics.on_load_phase)
        metrics.model_cache = registry.cache
        self.registry = registry
        self.service = InferenceService(
            registry,
            ServiceOptions(
                control_mode=settings.control_mode,
                poll_secs=settings.poll_secs,
                startup_models=settings.load_models,
                strict_readiness=settings.strict_readiness,
                request_timeout=settings.limits.request_timeout,
                server_name=settings.server_name,
                extensions=extensions,
                refresh=refresh,
            ),
            tracer=Tracer(settings.trace_settings, registry=registry),
            log_control=settings.log_control,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self.token = BearerToken(settings.auth_token_file) if settings.auth_token_file else None
        return True

    async def start(self) -> int:
        """The listeners, then the models (listeners start before models load: liveness answers at once,
        readiness once loading is done). 0 once serving, or when a stop signal came while models loaded;
        1 (logged) when a model failed to load under --exit-on-error or the Vertex AI listener cannot start.
        Raises SystemExit when an HTTP listener cannot start (a port in use)."""
        settings, service, metrics, token, shm = self.settings, self.service, self.metrics, self.token, self.shm
        servers = self.servers
        if settings.http_port is not None:
            from .http.app import build_http_app
            from .http.transport import choose

            http_app = build_http_app(service, settings.limits, token, shm)
            metrics.registry.register(http_app.paths)
            host = settings.http_host or settings.host
            if choose(settings.http_transport, settings.http_tls is not None) == "native":
                from .http.native import NativeHttpServer

                servers.append(NativeHttpServer(http_app, host, settings.http_port, settings.limits))
            else:
                servers.append(
                    _uvicorn(http_app, host, settings.http_port, settings.log_level, settings.limits, settings.http_tls)
                )
        if settings.metrics_port is not None:
            from .observability.endpoint import build_metrics_app

            servers.append(
                _uvicorn(
                    build_metrics_app(metrics, self.registry, service.live, service.ready),
                    settings.metrics_host or settings.host,
                    settings.metrics_port,
                    settings.log_level,
                    settings.limits,
                )
            )
        if settings.openai_port is not None:
            from .openai import build_openai_app

            servers.append(
                _uvicorn(
                    build_openai_app(service, token),
                    settings.openai_host or settings.host,
                    settings.openai_port,
                    settings.log_level,
                    settings.limits,
                    settings.http_tls,
                )
            )
        if settings.sagemaker_port is not None:
            from .http.app import build_http_app
            from .http.sagemaker import build_sagemaker_app

            servers.append(
                _uvicorn(
                    build_sagemaker_app(build_http_app(service, settings.limits, token, shm)),
                    settings.host,
                    settings.sagemaker_port,
                    settings.log_level,
                    settings.limits,
                )
            )
        for server in servers:
            self.tasks.append(asyncio.create_task(server.serve()))
        if settings.grpc_port is not None:
            from .grpc.settings import GrpcSettings
            from .grpc.transport import start_grpc_listener

            grpc_settings = GrpcSettings(
                settings.grpc_host or settings.host,
                settings.grpc_port,
                settings.limits,
                token,
                settings.grpc_tls,
                shm,
                settings.grpc_max_connection_age_ms,
                settings.grpc_max_connection_age_grace_ms,
                settings.grpc_keepalive,
            )
            self.grpc_server = await start_grpc_listener(settings.grpc_transport, service, grpc_settings)
        await asyncio.sleep(0)
        for server, task in zip(servers, self.tasks, strict=True):
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
            if task.done():
                task.result()  # a port in use: raise now
                raise SystemExit(f"HTTP listener on port {server.config.port} failed to start")
        service.listening_at = time.time()
        load = asyncio.create_task(service.start())
        self._stop_wait = asyncio.create_task(self._stop.wait())
        await asyncio.wait([load, self._stop_wait], return_when=asyncio.FIRST_COMPLETED)
        if not load.done():
            load.cancel()
            return 0
        load.result()
        failed = service.startup_failures() if settings.exit_on_error else []
        if failed:
            # Triton's --exit-on-error: a model that failed to load at start stops the server
            for reason in failed:
                log.error("failed to load %s", reason)
            log.error("exiting: %d model(s) failed to load and --exit-on-error is true", len(failed))
            return 1
        if settings.vertex_ai_port is not None and not await self._start_vertex_ai():
            return 1
        log.info(
            "kubeinfer-server ready: http=%s grpc=%s metrics=%s repository=%s",
            settings.http_port,
            settings.grpc_port,
            settings.metrics_port,
            ",".join(map(str, [settings.model_repository, *settings.more_repositories])),
        )
        return 0

    async def until_stopped(self) -> None:
        """Returns once SIGTERM or SIGINT came (at once if one came while models loaded)."""
        assert self._stop_wait is not None, "start() first"
        await self._stop_wait

    async def drain(self) -> None:
        """Readiness false and new inference requests refused; with --connection-drain-seconds, clients first
        get that long to move to other replicas; then in-flight and queued requests finish (bounded by
        --shutdown-timeout)."""
        settings, service = self.settings, self.service
        if settings.connection_drain_seconds > 0:
            # Behind a Service, keep-alive connections stay pinned to this pod after it left the endpoints:
            # answer a while longer, but make every HTTP response close its connection and send gRPC clients a
            # GOAWAY (in-flight RPCs finish), so that their next request reconnects to another replica.
            log.info(
                "stopping: %.0fs for clients to move to other replicas (HTTP Connection: close, gRPC GOAWAY)",
                settings.connection_drain_seconds,
            )
            service.close_connections()
            if self.grpc_server is not None:
                grace = settings.connection_drain_seconds + settings.shutdown_timeout
                self._grpc_stopped = asyncio.create_task(self.grpc_server.stop(grace=grace))
            await asyncio.sleep(settings.connection_drain_seconds)
        log.info("shutting down: draining in-flight requests (up to %.0fs)", settings.shutdown_timeout)
        await service.shutdown(settings.shutdown_timeout)

    async def stop(self, exit_code: int) -> int:
        """Closes the listeners and the shared-memory regions; returns ``exit_code``, or ends the process
        with it at once when model executions outlived the shutdown timeout."""
        for server in self.servers:
            server.should_exit = True
        if self._grpc_stopped is not None:
            await self._grpc_stopped
        elif self.grpc_server is not None:
            await self.grpc_server.stop(grace=2.0)  # RPCs still writing their response get this long
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.shm.close()
        log.info("kubeinfer-server stopped")
        if self.registry.abandoned:
            # their instances' threads are still inside execute(), and Python (and asyncio.run) would wait for
            # them at exit until Kubernetes kills the pod: the shutdown timeout has passed, so leave them, as
            # Triton does
            log.warning("exiting with %s still executing", ", ".join(self.registry.abandoned))
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exit_code)
        return exit_code

    async def _start_vertex_ai(self) -> bool:
        """Triton's Vertex AI listener, started once models loaded (its default model is picked from the ready
        ones); False (logged in Triton's words) when it cannot start."""
        from .http.app import build_http_app
        from .http.vertex_ai import VertexAiApp, default_model
        from .observability.endpoint import build_metrics_app

        settings, service = self.settings, self.service
        assert settings.vertex_ai_port is not None
        try:
            ready = [m["name"] for m in service.repository_index(ready_only=True)]
            model = default_model(list(dict.fromkeys(ready)), settings.vertex_ai_default_model)
        except ValueError as exc:
            log.error("failed to start Vertex AI service: %s", exc)
            return False
        app = VertexAiApp(
            build_http_app(service, settings.limits, self.token, self.shm),
            *settings.vertex_ai_routes,
            model,
            build_metrics_app(self.metrics, self.registry, service.live, service.ready)
            if settings.metrics_port is not None
            else None,
        )
        server = _uvicorn(app, settings.host, settings.vertex_ai_port, settings.log_level, settings.limits)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():
            with contextlib.suppress(BaseException):  # uvicorn logged why (a port in use) and exits
                task.result()
            log.error("failed to start Vertex AI service on port %d", settings.vertex_ai_port)
            return False
        self.servers.append(server)
        self.tasks.append(task)
        log.info(
            "Started Vertex AI HTTPService at %s:%d (default model '%s')", settings.host, settings.vertex_ai_port, model
        )
        return True


async def serve(settings: ServerSettings) -> int:
    """Runs one server process until SIGTERM or SIGINT (or a failed start); its exit status."""
    process = ServerProcess(settings)
    if not await process.build():
        return 1
    exit_code = await process.start()
    if exit_code == 0:
        await process.until_stopped()
    await process.drain()
    return await process.stop(exit_code)


def run(settings: ServerSettings) -> int:
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # uvloop is optional (no Windows wheels)
        runner = asyncio.run
    return int(runner(serve(settings)))
