"""Command lines: ``kubeinfer-server`` and the drop-in ``tritonserver``.

Both read Triton's flag names with Triton's meanings (``src/command_line_parser.cc`` in
triton-inference-server/server): ``--model-repository``/``--model-store``, ``--http-port``,
``--allow-grpc=true``, booleans as ``true/on/1/false/off/0``, ``--flag=value`` or ``--flag value``.
The two differ only in defaults: ``tritonserver`` keeps Triton's (``--exit-on-error=true``,
``--strict-readiness=true``) so a Triton deployment behaves the same; ``kubeinfer-server`` keeps
serving what loaded when one model is broken and reports readiness per model.

``kubeinfer-server tritonserver <flags>`` is the same as ``tritonserver <flags>``: the container image's
entry point is ``kubeinfer-server``, and KServe's Triton ServingRuntime passes
``args: [tritonserver, --model-store=/mnt/models, ...]`` to it, so changing only the image works.

Triton flags that have no meaning here are accepted and named in one warning at start (``IGNORED``);
flags whose silent omission would surprise would stop the server with a message instead (``REFUSED``;
none today: the SageMaker and Vertex AI listeners are served, ``http/sagemaker.py`` and ``http/vertex_ai.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .app import ServerSettings, run
from .backends.python.stub.dumpable import make_non_dumpable
from .grpc.settings import Keepalive
from .grpc.transport import ENV as GRPC_TRANSPORT_ENV
from .grpc.transport import TRANSPORTS as GRPC_TRANSPORTS
from .grpc.transport import default_transport as default_grpc_transport
from .http.transport import ENV as HTTP_TRANSPORT_ENV
from .http.transport import TRANSPORTS as HTTP_TRANSPORTS
from .http.transport import default_transport as default_http_transport
from .observability.latencies import parse_metrics_config
from .observability.logsettings import LogControl, LogSettings
from .observability.trace import parse_trace_config
from .repository.agents import DEFAULT_DIRECTORY as DEFAULT_REPOAGENT_DIRECTORY
from .repository.config_name import check_config_name
from .runtime.auth import TlsFiles
from .runtime.cache import parse_cache_settings
from .runtime.model_cache import CacheSettings
from .runtime.redis_cache import RedisConfig
from .scheduling.rate_limiter import parse_resource
from .sources.uris import is_cloud
from .vocabulary.limits import DEFAULT_LIMITS, Limits
from .vocabulary.server_defaults import GRPC_PORT, HTTP_PORT, METRICS_PORT, SHUTDOWN_TIMEOUT_SECONDS

log = logging.getLogger("kubeinfer.server")

#: Triton flags accepted for compatibility that change nothing here, with the reason
IGNORED: dict[str, str] = {
    "--http-thread-count": "HTTP is served by one asyncio event loop",
    "--http-header-forward-pattern": "request headers are not forwarded to models",
    "--http-restricted-api": "API restriction by header is not implemented",
    "--reuse-http-port": "SO_REUSEPORT is not used",
    "--reuse-grpc-port": "SO_REUSEPORT is not used",
    "--grpc-header-forward-pattern": "request headers are not forwarded to models",
    "--grpc-infer-allocation-pool-size": "gRPC responses are not pooled",
    "--grpc-infer-thread-count": "gRPC is served by the asyncio event loop",
    "--grpc-max-response-pool-size": "gRPC responses are not pooled",
    "--grpc-response-compression-level": "gRPC response compression is not configured",
    "--grpc-restricted-protocol": "protocol restriction by header is not implemented",
    "--allow-gpu-metrics": "GPU gauges are exported whenever NVML finds a GPU",
    "--allow-cpu-metrics": "CPU gauges are always exported",
    "--metrics-interval-ms": "gauges are read at scrape time",
    "--pinned-memory-pool-byte-size": "no pinned-memory pool (host tensors are numpy arrays)",
    "--cuda-memory-pool-byte-size": "each backend manages its own device memory",
    "--cuda-virtual-address-size": "each backend manages its own device memory",
    "--min-supported-compute-capability": "the CUDA runtime decides which GPUs are usable",
    "--backend-directory": "backends are Python packages (entry-point group kubeinfer.backends)",
    "--buffer-manager-thread-count": "no buffer manager threads",
    "--model-load-retry-count": "a failed load is reported, not retried",
    "--model-load-gpu-limit": "no device memory limit is enforced at load",
    "--host-policy": "host policies (NUMA binding) are not applied",
    "--cache-directory": "no on-disk cache",
    "--sagemaker-thread-count": "SageMaker requests are served by the asyncio event loop",
    "--vertex-ai-thread-count": "Vertex AI requests are served by the asyncio event loop",
}
#: Triton flags whose effect this server cannot give; starting without it would mislead
REFUSED: dict[str, str] = {}
#: flags that take no value (all others take exactly one)
_NO_VALUE = {"--disable-auto-complete-config"}
#: refused flags that may be given with their "off" value
_FALSE_OK: set[str] = set()


def _limit_flags(p: argparse.ArgumentParser) -> None:
    """Request limits (see ``vocabulary.limits``); each refusal names the flag that raises it."""
    d = DEFAULT_LIMITS
    g = p.add_argument_group("request limits")
    g.add_argument(
        "--http-max-input-size",
        type=_positive,
        default=d.http_max_input_size,
        help="largest HTTP request body in bytes (413 beyond; Triton's flag and default, 64 MiB)",
    )
    g.add_argument(
        "--grpc-max-message-bytes",
        type=_positive,
        default=d.grpc_max_message_bytes,
        help="largest gRPC message in bytes, each direction (RESOURCE_EXHAUSTED beyond)",
    )
    g.add_argument(
        "--max-header-bytes",
        type=_positive,
        default=d.max_header_bytes,
        help="largest HTTP request line + headers (431 beyond) and gRPC metadata",
    )
    g.add_argument(
        "--max-tensor-elements", type=_positive, default=d.max_tensor_elements, help="elements in one input tensor"
    )
    g.add_argument(
        "--max-request-elements",
        type=_positive,
        default=d.max_request_elements,
        help="elements in all inputs of one request",
    )
    g.add_argument(
        "--max-bytes-element-size",
        type=_positive,
        default=d.max_bytes_element_size,
        help="bytes in one BYTES (string) element",
    )
    g.add_argument("--max-inputs", type=_positive, default=d.max_inputs, help="inputs in one request")
    g.add_argument(
        "--grpc-max-stream-inflight",
        type=_positive,
        default=d.grpc_max_stream_inflight,
        help="requests of one ModelStreamInfer stream running at once (the stream is not read beyond)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout,
        help="seconds an inference request may take end to end, then 504 / DEADLINE_EXCEEDED (0: no limit)",
    )
    g.add_argument(
        "--http-header-timeout",
        type=_non_negative,
        default=d.http_header_timeout,
        help="seconds an HTTP request's line and headers may take to arrive, from their first byte (from the "
        "connection opening, for its first request); 408 and the connection closes beyond (0: no limit)",
    )
    g.add_argument(
        "--http-body-timeout",
        type=_non_negative,
        default=d.http_body_timeout,
        help="seconds an HTTP request's body may take to arrive once its headers have; 408 and the connection "
        "closes beyond (0: no limit). A body of --http-max-input-size must arrive at that size / this rate",
    )
    g.add_argument(
        "--http-max-connections",
        type=_non_negative_int,
        default=d.http_max_connections,
        help="open HTTP connections past which a request is answered 503 with Connection: close (0: no limit)",
    )


def _security_flags(p: argparse.ArgumentParser) -> None:
    """Optional authentication and TLS (off by default); gRPC's flags are Triton's."""
    g = p.add_argument_group("authentication and TLS (off by default; the metrics listener stays plain)")
    g.add_argument(
        "--auth-token-file",
        type=Path,
        default=None,
        help="require 'Authorization: Bearer <token>' on HTTP and gRPC (not on the health probes); the file "
        "holds the token (e.g. a mounted Secret) and is re-read when it changes; emptying or deleting it "
        "revokes the token (every request refused until it holds one again)",
    )
    g.add_argument("--http-tls-cert", type=Path, default=None, help="serve HTTPS with this certificate (PEM)")
    g.add_argument("--http-tls-key", type=Path, default=None, help="private key of --http-tls-cert (PEM)")
    g.add_argument(
        "--http-tls-client-ca", type=Path, default=None, help="require client certificates signed by this CA (mTLS)"
    )
    g.add_argument("--grpc-use-ssl", type=_bool, default=False, help="serve gRPC over TLS (Triton's flag)")
    g.add_argument("--grpc-use-ssl-mutual", type=_bool, default=False, help="also require client certificates (mTLS)")
    g.add_argument("--grpc-server-cert", type=Path, default=None, help="gRPC server certificate (PEM)")
    g.add_argument("--grpc-server-key", type=Path, default=None, help="gRPC server private key (PEM)")
    g.add_argument("--grpc-root-cert", type=Path, default=None, help="CA that signs client certificates (mTLS)")


def _keepalive_flags(g: argparse._ArgumentGroup) -> None:
    """Triton's HTTP/2 keepalive flags and defaults (grpc.settings.Keepalive says what each transport does)."""
    d = Keepalive()
    g.add_argument(
        "--grpc-keepalive-time",
        type=_positive,
        default=d.time_ms,
        metavar="MS",
        help="PING a gRPC connection quiet for this long (Triton's default: 2 hours)",
    )
    g.add_argument(
        "--grpc-keepalive-timeout",
        type=_positive,
        default=d.timeout_ms,
        metavar="MS",
        help="close the connection when that PING is not answered within this long (default 20 s)",
    )
    g.add_argument(
        "--grpc-keepalive-permit-without-calls",
        type=_bool,
        default=d.permit_without_calls,
        help="grpc.aio: also PING connections with no call running (the Rust transport always does)",
    )
    g.add_argument(
        "--grpc-http2-max-pings-without-data",
        type=_non_negative_int,
        default=d.max_pings_without_data,
        help="grpc.aio: PINGs sent with no data in between (0: no limit)",
    )
    g.add_argument(
        "--grpc-http2-min-recv-ping-interval-without-data",
        type=_non_negative_int,
        default=d.min_recv_ping_interval_without_data_ms,
        metavar="MS",
        help="grpc.aio: a client PING sooner than this after the last, with no data, is a strike",
    )
    g.add_argument(
        "--grpc-http2-max-ping-strikes",
        type=_non_negative_int,
        default=d.max_ping_strikes,
        help="grpc.aio: strikes before the connection is closed (0: no limit)",
    )


def _keepalive(args: argparse.Namespace) -> Keepalive:
    return Keepalive(
        time_ms=args.grpc_keepalive_time,
        timeout_ms=args.grpc_keepalive_timeout,
        permit_without_calls=args.grpc_keepalive_permit_without_calls,
        max_pings_without_data=args.grpc_http2_max_pings_without_data,
        min_recv_ping_interval_without_data_ms=args.grpc_http2_min_recv_ping_interval_without_data,
        max_ping_strikes=args.grpc_http2_max_ping_strikes,
    )


def _tls_settings(args: argparse.Namespace) -> tuple[TlsFiles | None, TlsFiles | None]:
    """(HTTP, gRPC) TLS files; ValueError for a half-given or unreadable set."""
    http = None
    if args.http_tls_cert or args.http_tls_key or args.http_tls_client_ca:
        if not (args.http_tls_cert and args.http_tls_key):
            raise ValueError("HTTPS needs both --http-tls-cert and --http-tls-key")
        http = TlsFiles(args.http_tls_cert, args.http_tls_key, args.http_tls_client_ca)
    grpc = None
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        if not (args.grpc_server_cert and args.grpc_server_key):
            raise ValueError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
            raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert (the CA of the client certificates)")
        client_ca = args.grpc_root_cert if args.grpc_use_ssl_mutual else None
        grpc = TlsFiles(args.grpc_server_cert, args.grpc_server_key, client_ca)
    for tls in (http, grpc):
        for path in (tls.cert, tls.key, tls.client_ca) if tls else ():
            if path is not None and not path.is_file():
                raise ValueError(f"TLS file '{path}' does not exist")
    if args.auth_token_file is not None:
        if not args.auth_token_file.is_file():
            raise ValueError(f"--auth-token-file '{args.auth_token_file}' does not exist")
        if not args.auth_token_file.read_bytes().strip():
            raise ValueError(f"--auth-token-file '{args.auth_token_file}' is empty: it must hold the token")
    return http, grpc


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        http_max_input_size=args.http_max_input_size,
        grpc_max_message_bytes=args.grpc_max_message_bytes,
        max_header_bytes=args.max_header_bytes,
        max_tensor_elements=args.max_tensor_elements,
        max_request_elements=args.max_request_elements,
        max_bytes_element_size=args.max_bytes_element_size,
        max_inputs=args.max_inputs,
        grpc_max_stream_inflight=args.grpc_max_stream_inflight,
        request_timeout=max(0.0, args.request_timeout),
        http_header_timeout=args.http_header_timeout,
        http_body_timeout=args.http_body_timeout,
        http_max_connections=args.http_max_connections,
    )


def _non_negative(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{value}'") from None
    if not n >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got '{value}'")
    return n


def _non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{value}'") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{value}'")
    return n


_BYTE_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
}


def _byte_size(value: str) -> int:
    """Bytes as an integer or a Kubernetes quantity (``512Mi``, ``2Gi``, ``1.5G``)."""
    text = value.strip()
    number = text.rstrip("kKMGTi")
    suffix = text[len(number) :]
    if suffix == "K":
        suffix = "k"
    try:
        n = float(number) * _BYTE_SUFFIXES[suffix]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"expected bytes (an integer, or a quantity such as 512Mi or 2Gi), got '{value}'"
        ) from None
    if not n >= 0:
        raise argparse.ArgumentTypeError(f"expected bytes >= 0, got '{value}'")
    return int(n)


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{value}'") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{value}'")
    return n


def _bool(value: str) -> bool:
    """Triton's boolean values (``ParseOption<bool>``): true/on/1 and false/off/0, any case."""
    lower = value.lower()
    if lower in ("1", "true", "on", "yes"):
        return True
    if lower in ("0", "false", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {value}")


def _int_bool(value: str) -> int:
    """``--log-verbose``: an integer level, or true/false (Triton's ``ParseIntBoolOption``)."""
    lower = value.lower()
    if lower == "true":
        return 1
    if lower == "false":
        return 0
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {value}") from None


def build_parser(triton: bool = False) -> argparse.ArgumentParser:
    """The flags of both commands; ``triton`` selects Triton's defaults."""
    prog = "tritonserver" if triton else "kubeinfer-server"
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve a Triton-style model repository over KServe v2 HTTP and gRPC "
        "(flags follow tritonserver's; see docs/server.md).",
        allow_abbrev=False,
    )
    repo = p.add_argument_group("model repository")
    repo.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        type=_repository_arg,
        action="append",
        default=[],
        help="model repository folder, or a cloud repository: s3://bucket/path, s3://host:port/bucket/path "
        "(copied locally per model, as Triton does; credentials from TRITON_CLOUD_CREDENTIAL_PATH or AWS_*) "
        "(may repeat, as Triton: models are merged across the repositories, and a model found in more than "
        "one is not served; a cloud repository must be the only one). "
        + ("" if triton else "Default: the bundled example repository, generated on first use."),
    )
    repo.add_argument(
        "--model-namespacing",
        type=_bool,
        default=False,
        help="as Triton: a model is its repository and its name, so the same name in two --model-repository "
        "folders is two models, both served; a request by a name several repositories hold is refused as "
        "ambiguous, and an ensemble's steps use the models of its own repository first (default false)",
    )
    repo.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    repo.add_argument("--repository-poll-secs", type=float, default=15.0, help="poll interval in poll mode")
    repo.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: model to load at start ('*' for all, alone); repeatable",
    )
    repo.add_argument(
        "--exit-on-error",
        type=_bool,
        default=triton,
        help="exit if a model fails to load at start (Triton's default true; kubeinfer-server's false)",
    )
    repo.add_argument(
        "--strict-readiness",
        type=_bool,
        default=triton,
        help="/v2/health/ready only when every model in the repository is ready",
    )
    repo.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="do not fill inputs, outputs or max_batch_size from the model file",
    )
    repo.add_argument(
        "--strict-model-config",
        type=_bool,
        default=None,
        help="deprecated Triton spelling: true is --disable-auto-complete-config",
    )
    repo.add_argument(
        "--model-load-thread-count", type=int, default=4, help="models loaded in parallel at start and on poll"
    )
    repo.add_argument(
        "--model-config-name",
        default=None,
        metavar="NAME",
        help="read <model>/configs/NAME.pbtxt instead of config.pbtxt where a model has one (Triton's flag)",
    )
    repo.add_argument(
        "--repoagent-directory",
        default=DEFAULT_REPOAGENT_DIRECTORY,
        metavar="DIR",
        help="Triton's folder of repository agent libraries: agents here are built in (checksum) or Python "
        "packages (entry-point group kubeinfer.repository_agents); a config naming another fails its load "
        "with Triton's words, which name this folder",
    )
    mc = p.add_argument_group("model cache: models on demand within a memory budget (beyond Triton)")
    mc.add_argument(
        "--model-load-on-demand",
        type=_bool,
        default=False,
        help="load a repository model on its first request (which waits for it) instead of at start; the "
        "index lists models not loaded as UNAVAILABLE 'not loaded'; a repository API load pins a model "
        "(explicit mode)",
    )
    mc.add_argument(
        "--model-cache-memory-budget",
        type=_byte_size,
        default=0,
        metavar="BYTES",
        help="host memory the loaded models may take (e.g. 4Gi; implies --model-load-on-demand): before a load "
        "that would pass it, the least recently used idle models are unloaded (never one with requests in "
        "flight, a live sequence or a pin). Each model's footprint is measured at its load (0: no budget)",
    )
    mc.add_argument(
        "--model-idle-unload-seconds",
        type=_non_negative,
        default=0.0,
        help="with on-demand loading: unload a model no request used for this long (0: never)",
    )
    mc.add_argument(
        "--model-load-timeout",
        type=_non_negative,
        default=60.0,
        help="with on-demand loading: seconds a request waits for its model to load, then 503 / UNAVAILABLE",
    )
    mc.add_argument(
        "--model-load-abandon-seconds",
        type=_non_negative,
        default=600.0,
        help="with on-demand loading: a load still running after this long is abandoned: its requests get 503 / "
        "UNAVAILABLE and the model is refused with the reason until that load has returned (what it loaded is "
        "unloaded) and as long again has passed, or until a repository API load",
    )
    mc.add_argument(
        "--model-cache-swaps-per-minute",
        type=_non_negative_int,
        default=60,
        help="with a budget: loads that unload another model to make room, at most this many in any minute; past "
        "it a request for a model not loaded that needs room gets 503 / UNAVAILABLE 'try again in Ns' and no "
        "loaded model is unloaded (0: no limit)",
    )
    repo.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]SETTING=VALUE",
        help="backend settings; 'default-max-batch-size=N' applies to auto-completed configs",
    )
    repo.add_argument(
        "--allowed-backends",
        type=lambda v: tuple(sorted({b.strip() for b in v.split(",") if b.strip()})),
        default=None,
        metavar="BACKEND[,BACKEND...]",
        help="load only models of these backends (default: all); others are UNAVAILABLE with the reason -- "
        "e.g. keep model code (python, pytorch) off a shared pool",
    )
    repo.add_argument(
        "--rate-limit",
        choices=["off", "execution_count"],
        default="off",
        help="'execution_count': an instance executes only when the resources its instance_group's "
        "rate_limiter names are free, instances served by priority; 'off': rate_limiter sections are ignored",
    )
    repo.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="copies of a rate-limiter resource (per device, or on DEVICE only); default: the largest count "
        "an instance asks for. Once one is given, resources not given have none",
    )

    net = p.add_argument_group("listeners")
    net.add_argument("--host", default="0.0.0.0", help="address for all listeners unless one is given below")
    net.add_argument("--http-address", default=None)
    net.add_argument("--grpc-address", default=None)
    net.add_argument("--metrics-address", default=None)
    net.add_argument("--http-port", type=int, default=HTTP_PORT)
    net.add_argument("--grpc-port", type=int, default=GRPC_PORT)
    net.add_argument("--metrics-port", type=int, default=METRICS_PORT)
    net.add_argument(
        "--openai-port",
        type=int,
        default=-1,
        help="port of the OpenAI-compatible API (/v1/models, /v1/chat/completions, /v1/completions, "
        "/v1/embeddings; docs/api/openai.md); -1 (default): off",
    )
    net.add_argument("--openai-address", default=None)
    net.add_argument(
        "--grpc-transport",
        choices=GRPC_TRANSPORTS,
        default=None,
        help="what serves the gRPC listener: 'rust' (the Rust HTTP/2 transport, a third of grpc.aio's CPU per "
        "call; refuses to start if it cannot serve the configuration), 'grpcio' (grpc.aio), 'auto' (rust when "
        f"it is built and serves the configuration, else grpcio, logged). Default: ${GRPC_TRANSPORT_ENV}, else "
        "auto",
    )
    net.add_argument(
        "--http-transport",
        choices=HTTP_TRANSPORTS,
        default=None,
        help="what serves the HTTP listener: 'native' (the Rust extension's HTTP/1.1 server; refuses to start if "
        "it cannot serve the configuration), 'asgi' (uvicorn), 'auto' (uvicorn for now, logged). Default: "
        f"${HTTP_TRANSPORT_ENV}, else auto",
    )
    # default: true, false when $AIP_MODE is PREDICTION (Triton, for Vertex AI)
    net.add_argument("--allow-http", type=_bool, default=None)
    net.add_argument("--allow-grpc", type=_bool, default=None)
    _cloud_flags(net)
    net.add_argument("--allow-metrics", type=_bool, default=True)
    net.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="Triton's latency families: summary_latencies=true, summary_quantiles=Q:ERR,..., "
        "histogram_latencies=true, counter_latencies=false (repeatable; see docs/observability.md)",
    )
    net.add_argument(
        "--allow-client-shm",
        type=_bool,
        default=False,
        help="let clients register system (and, with a GPU, CUDA) shared-memory regions and send tensors "
        "through them (Triton 26.04+; default false: a region key can name any shared-memory object "
        "the server's user may open)",
    )

    cache = p.add_argument_group("response cache")
    cache.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES | redis,KEY=VALUE",
        help="the response cache shared by models with response_cache { enable: true }: local,size=BYTES, or "
        "Triton's Redis cache, one key per flag (redis,host=H redis,port=P, and optionally user, password, db, "
        "connect_timeout, socket_timeout, pool_size, wait_timeout, tls_enabled, cert, key, cacert, cacert_dir)",
    )
    cache.add_argument(
        "--response-cache-byte-size", type=int, default=None, help="deprecated Triton spelling of local,size=N"
    )

    srv = p.add_argument_group("server")
    srv.add_argument("--id", default=None, help="server name in the server metadata")
    srv.add_argument(
        "--allow-external-op-libraries",
        type=_bool,
        default=True,
        help="let model_operations op_library_filename name a library outside the model's own folder (an "
        "absolute path; Triton's behaviour, default true). false: a model may load only libraries it ships "
        "in its folder, so a model on a shared pool cannot make the server run code from elsewhere",
    )
    srv.add_argument(
        "--exit-timeout-secs",
        "--shutdown-timeout",
        dest="shutdown_timeout",
        type=float,
        default=float(SHUTDOWN_TIMEOUT_SECONDS),
        help="seconds in-flight requests may take to finish after SIGTERM",
    )
    srv.add_argument(
        "--connection-drain-seconds",
        type=_non_negative,
        default=0.0,
        help="after SIGTERM, keep answering for this long while sending open connections away (HTTP "
        "'Connection: close', gRPC GOAWAY; readiness false), then refuse new requests and drain: clients pinned "
        "to a terminating pod by keep-alive reconnect to another replica instead of getting 503 (default 0)",
    )
    srv.add_argument(
        "--grpc-max-connection-age",
        type=_non_negative_int,
        default=0,
        metavar="MS",
        help="milliseconds after which each gRPC connection gets a graceful GOAWAY (grpc.aio adds +-10%% jitter; "
        "in-flight RPCs finish, the client reconnects; Triton's flag): behind a Kubernetes Service, channels spread "
        "over new replicas and leave a pod that left the endpoints before it stops (default 0: never)",
    )
    srv.add_argument(
        "--grpc-max-connection-age-grace",
        type=_non_negative_int,
        default=0,
        metavar="MS",
        help="milliseconds a connection sent away by --grpc-max-connection-age may still run calls before it is "
        "closed (Triton's flag; default 0: until they finish)",
    )
    _keepalive_flags(srv)
    srv.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    srv.add_argument("--log-verbose", type=_int_bool, default=0, help="verbose logging level (>0: debug)")
    srv.add_argument("--log-info", type=_bool, default=True)
    srv.add_argument("--log-warning", type=_bool, default=True)
    srv.add_argument("--log-error", type=_bool, default=True)
    srv.add_argument("--log-file", default=None, help="write the log to this file instead of stderr")
    srv.add_argument("--log-format", choices=["default", "ISO8601"], default="default")

    trace = p.add_argument_group("trace")
    trace.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="rate=N, count=N, level=TIMESTAMPS|TENSORS|OFF (repeatable), mode=triton|opentelemetry, "
        "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=HOST:PORT/v1/traces, "
        "opentelemetry,resource=KEY=VALUE (repeatable), opentelemetry,bsp_max_queue_size=N, "
        "opentelemetry,bsp_schedule_delay=MS, opentelemetry,bsp_max_export_batch_size=N (Triton's)",
    )
    for old_flag, setting in (
        ("--trace-file", "triton,file"),
        ("--trace-level", "level"),
        ("--trace-rate", "rate"),
        ("--trace-count", "count"),
        ("--trace-log-frequency", "triton,log-frequency"),
    ):
        trace.add_argument(
            old_flag,
            action="append",
            default=[],
            dest=_dest(old_flag),
            help=f"deprecated Triton spelling of --trace-config {setting}=...",
        )

    _limit_flags(p)
    _security_flags(p)

    compat = p.add_argument_group("accepted for compatibility (see docs/server.md)")
    for flag in sorted(IGNORED) + sorted(REFUSED):
        if flag in _NO_VALUE:
            compat.add_argument(flag, action="store_true", default=None, help=argparse.SUPPRESS)
        else:
            compat.add_argument(flag, default=None, help=argparse.SUPPRESS)
    return p


def compat_notices(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(warnings for ignored flags, errors for refused flags) from parsed ``args``."""
    warnings: list[str] = []
    errors: list[str] = []
    for flag, reason in IGNORED.items():
        if getattr(args, _dest(flag)) is not None:
            warnings.append(f"{flag} is ignored: {reason}")
    for flag, reason in REFUSED.items():
        value = getattr(args, _dest(flag))
        if value is None:
            continue
        if flag in _FALSE_OK:
            try:
                if not _bool(value):
                    continue
            except argparse.ArgumentTypeError:
                pass
        errors.append(f"{flag} is not supported: {reason}")
    return warnings, errors


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def parse_backend_config(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``--backend-config=[<backend>,]<setting>=<value>`` → {backend or "": {setting: value}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        backend, _, rest = item.partition(",") if "," in item.split("=", 1)[0] else ("", "", item)
        setting, sep, value = rest.partition("=")
        if not sep or not setting:
            raise ValueError(f"--backend-config '{item}': expected [<backend>,]<setting>=<value>")
        out.setdefault(backend, {})[setting] = value
    return out


def _repository_arg(value: str) -> Path | str:
    """A local folder as a Path; a cloud repository (``s3://``, ``gs://``, ``as://``) kept as the URI it is."""
    return value if is_cloud(value) else Path(value)


def settings_from_args(args: argparse.Namespace, triton: bool) -> ServerSettings:
    """The server settings the parsed flags describe; raises ValueError on contradictions."""
    repos: list[Path | str] = args.model_repository
    if not repos and os.environ.get("AIP_STORAGE_URI"):  # Triton, for Vertex AI
        repos = [_repository_arg(os.environ["AIP_STORAGE_URI"])]
    listeners, vertex_port, vertex_routes = _cloud_listeners(args)
    more: list[Path] = []
    if len(repos) > 1:
        if any(isinstance(r, str) for r in repos):
            raise ValueError(
                "a cloud model repository (s3://, gs://, as://) cannot be combined with other model "
                "repositories (--model-repository/--model-store): give it alone"
            )
        for extra in repos[1:]:
            assert isinstance(extra, Path)
            if not extra.is_dir():
                raise ValueError(f"model repository '{extra}' is not a folder")
            more.append(extra.resolve())
    cloud: str | None = None
    if repos and isinstance(repos[0], str):
        # the stores' libraries (botocore, google-auth, azure-storage-blob) are imported only for a cloud repository
        from .sources.repository_stores import check_uri, mount_variable

        cloud = repos[0]
        check_uri(cloud)
        mount = os.environ.get(mount_variable(cloud))  # Triton's TRITON_{AWS,GCS,AZURE}_MOUNT_DIRECTORY
        repo = Path(mount) if mount else Path(tempfile.mkdtemp(prefix="kubeinfer-cloud-repository-"))
        repo.mkdir(parents=True, exist_ok=True)
    elif repos:
        repo = Path(repos[0])
    elif triton:
        raise ValueError("--model-repository (or --model-store) must be specified")
    else:
        from .examples.generate import default_repository

        repo = default_repository()
    if not repo.is_dir():
        raise ValueError(f"model repository '{repo}' is not a folder")
    if "*" in args.load_model and len(args.load_model) > 1:
        raise ValueError("--load-model=* must be the only --load-model argument")
    if args.model_load_thread_count < 1:
        raise ValueError("--model-load-thread-count must be at least 1")
    if args.model_config_name is not None:
        check_config_name(args.model_config_name)
    auto_complete = not args.disable_auto_complete_config and not args.strict_model_config
    model_cache = _model_cache(args)
    if args.model_namespacing and model_cache is not None and len(repos) > 1:
        raise ValueError("--model-namespacing=true cannot be combined with the model cache (models loaded on demand)")
    response_cache = _response_cache(args)
    backend_config = parse_backend_config(args.backend_config)
    host = args.host
    http_tls, grpc_tls = _tls_settings(args)
    return ServerSettings(
        model_repository=repo.resolve(),
        # Triton keeps a set of repository paths: one given twice counts once
        more_repositories=tuple(p for p in dict.fromkeys(more) if p != repo.resolve()),
        cloud_repository=cloud,
        host=host,
        http_host=args.http_address or host,
        grpc_host=args.grpc_address or host,
        metrics_host=args.metrics_address or host,
        http_port=args.http_port if listeners["http"] else None,
        grpc_port=args.grpc_port if listeners["grpc"] else None,
        metrics_port=args.metrics_port if args.allow_metrics else None,
        openai_host=args.openai_address or host,
        openai_port=args.openai_port if args.openai_port >= 0 else None,
        sagemaker_port=args.sagemaker_port if listeners["sagemaker"] else None,
        vertex_ai_port=vertex_port if listeners["vertex"] else None,
        vertex_ai_default_model=args.vertex_ai_default_model or "",
        vertex_ai_routes=vertex_routes,
        control_mode=args.model_control_mode,
        poll_secs=args.repository_poll_secs,
        load_models=tuple(args.load_model),
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        auto_complete=auto_complete,
        model_config_name=args.model_config_name or "",
        repoagent_directory=args.repoagent_directory,
        load_threads=args.model_load_thread_count,
        backend_config=backend_config,
        allowed_backends=args.allowed_backends,
        rate_limit=args.rate_limit == "execution_count",
        rate_limit_resources=tuple(parse_resource(r) for r in args.rate_limit_resource),
        server_name=args.id,
        allow_client_shm=args.allow_client_shm,
        allow_external_op_libraries=args.allow_external_op_libraries,
        response_cache_bytes=response_cache if isinstance(response_cache, int) else 0,
        response_cache_redis=None if isinstance(response_cache, int) else response_cache,
        model_cache=model_cache,
        model_namespacing=args.model_namespacing,
        trace_settings=parse_trace_config(_trace_items(args)),
        metrics_config=parse_metrics_config(args.metrics_config),
        shutdown_timeout=args.shutdown_timeout,
        connection_drain_seconds=args.connection_drain_seconds,
        grpc_max_connection_age_ms=args.grpc_max_connection_age,
        grpc_max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        grpc_keepalive=_keepalive(args),
        grpc_transport=args.grpc_transport or default_grpc_transport(),
        http_transport=args.http_transport or default_http_transport(),
        limits=_limits(args),
        auth_token_file=args.auth_token_file,
        http_tls=http_tls,
        grpc_tls=grpc_tls,
        log_level=_log_level(args),
    )


def _cloud_flags(net: argparse._ArgumentGroup) -> None:
    """Triton's SageMaker and Vertex AI listeners (docs/server.md, the paragraph on Triton flags)."""
    net.add_argument(
        "--allow-sagemaker",
        type=_bool,
        default=False,
        help="serve SageMaker's /ping and /invocations on --sagemaker-port "
        "(model: $SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)",
    )
    net.add_argument("--sagemaker-port", type=int, default=8080)
    net.add_argument(
        "--sagemaker-safe-port-range",
        default=None,
        metavar="LOW-HIGH",
        help="the ports the other listeners must use (SageMaker's SAGEMAKER_SAFE_PORT_RANGE)",
    )
    net.add_argument(
        "--allow-vertex-ai",
        type=_bool,
        default=None,
        help="serve Vertex AI's $AIP_HEALTH_ROUTE and $AIP_PREDICT_ROUTE on --vertex-ai-port "
        "(default: true when $AIP_MODE is PREDICTION, which also turns HTTP and gRPC off by default)",
    )
    net.add_argument("--vertex-ai-port", type=int, default=None, help="default: $AIP_HTTP_PORT, else 8080")
    net.add_argument(
        "--vertex-ai-default-model",
        default=None,
        help="the model the predict route serves (default: the repository's only model)",
    )


def _cloud_listeners(args: argparse.Namespace) -> tuple[dict[str, bool], int, tuple[str, str]]:
    """Which listeners are on, the Vertex AI port and routes; ValueError (Triton's words) on a port conflict."""
    prediction = os.environ.get("AIP_MODE", "") == "PREDICTION"
    on = {
        "http": args.allow_http if args.allow_http is not None else not prediction,
        "grpc": args.allow_grpc if args.allow_grpc is not None else not prediction,
        "metrics": bool(args.allow_metrics),
        "sagemaker": bool(args.allow_sagemaker),
        "vertex": args.allow_vertex_ai if args.allow_vertex_ai is not None else prediction,
    }
    port = args.vertex_ai_port
    if port is None:
        try:
            port = int(os.environ.get("AIP_HTTP_PORT", "8080"))
        except ValueError:
            raise ValueError(f"Invalid option value. Got {os.environ['AIP_HTTP_PORT']} (AIP_HTTP_PORT)") from None
    routes = ("", "")
    if on["sagemaker"]:
        from .http.sagemaker import inference_type

        inference_type()
    if on["vertex"]:
        from .http.vertex_ai import routes as vertex_routes

        routes = vertex_routes(dict(os.environ))
    safe: tuple[int, int] | None = None
    if args.sagemaker_safe_port_range is not None:
        low, sep, high = args.sagemaker_safe_port_range.partition("-")
        try:
            if not sep:
                raise ValueError
            safe = (int(low), int(high))
        except ValueError:
            raise ValueError(
                "Cannot parse pair option due to incorrect number of inputs.--<pair option> argument requires "
                f"format <first>-<second>. Found: {args.sagemaker_safe_port_range}"
            ) from None
    # Triton's CheckPortCollision (listeners on one address; a SageMaker safe range bounds the others)
    host = args.host
    ports = [
        (label, address, p, rng)
        for label, key, address, p, rng in (
            ("HTTP", "http", args.http_address or host, args.http_port, None),
            ("GRPC", "grpc", args.grpc_address or host, args.grpc_port, None),
            ("metrics", "metrics", args.metrics_address or host, args.metrics_port, None),
            ("SageMaker", "sagemaker", host, args.sagemaker_port, safe),
            ("Vertex AI", "vertex", host, port, None),
        )
        if on[key]
    ]
    for i, (label, address, p, rng) in enumerate(ports):
        for j, (other, other_address, q, _) in enumerate(ports):
            if j == i or (rng is None and j < i) or address != other_address:
                continue
            if rng is not None and not rng[0] <= q <= rng[1]:
                raise ValueError(
                    f"The server cannot listen to {other} requests at port {q}, allowed port range is "
                    f"[{rng[0]}, {rng[1]}]"
                )
            if p == q:
                raise ValueError(
                    f"The server cannot listen to {label} requests and {other} requests at the same address and "
                    f"port {address}:{p}"
                )
    return on, port, routes


def _model_cache(args: argparse.Namespace) -> CacheSettings | None:
    """The model cache's settings (None: models load as the control mode says)."""
    on = args.model_load_on_demand or args.model_cache_memory_budget > 0
    if not on:
        for flag, value, default in (
            ("--model-idle-unload-seconds", args.model_idle_unload_seconds, 0.0),
            ("--model-load-timeout", args.model_load_timeout, 60.0),
            ("--model-load-abandon-seconds", args.model_load_abandon_seconds, 600.0),
            ("--model-cache-swaps-per-minute", args.model_cache_swaps_per_minute, 60),
        ):
            if value != default:
                raise ValueError(f"{flag} needs --model-load-on-demand=true or --model-cache-memory-budget")
        return None
    if args.model_load_timeout <= 0:
        raise ValueError("--model-load-timeout must be more than 0 seconds")
    if args.model_load_abandon_seconds <= 0:
        raise ValueError("--model-load-abandon-seconds must be more than 0 seconds")
    return CacheSettings(
        memory_budget=args.model_cache_memory_budget,
        idle_unload_seconds=args.model_idle_unload_seconds,
        load_timeout=args.model_load_timeout,
        abandon_seconds=args.model_load_abandon_seconds,
        swaps_per_minute=args.model_cache_swaps_per_minute,
    )


def _trace_items(args: argparse.Namespace) -> list[str]:
    """--trace-config items, the deprecated --trace-* flags first (Triton lets --trace-config win)."""
    items = [f"triton,file={v}" for v in args.trace_file]
    items += [f"level={v}" for v in args.trace_level]
    items += [f"rate={v}" for v in args.trace_rate]
    items += [f"count={v}" for v in args.trace_count]
    items += [f"triton,log-frequency={v}" for v in args.trace_log_frequency]
    return items + list(args.trace_config)


def log_settings(args: argparse.Namespace) -> LogSettings:
    """The logging extension's settings from Triton's --log-* flags (or --log-level)."""
    settings = LogSettings(
        log_file=args.log_file or "",
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        log_verbose_level=max(0, args.log_verbose),
        log_format=args.log_format,
    )
    level = args.log_level
    if level == "debug":
        settings.log_verbose_level = max(1, settings.log_verbose_level)
    elif level in ("warning", "error"):
        settings.log_info = False
        settings.log_warning = level == "warning"
    return settings


def _response_cache(args: argparse.Namespace) -> int | RedisConfig:
    """``--cache-config local,size=N``, or the deprecated ``--response-cache-byte-size N`` (Triton: the same);
    or ``--cache-config redis,KEY=VALUE`` repeated."""
    size = parse_cache_settings(args.cache_config)
    if isinstance(size, RedisConfig):
        if args.response_cache_byte_size is not None:
            raise ValueError(
                "Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                "Please provide one or the other."
            )
        return size
    if args.response_cache_byte_size is not None:
        if args.response_cache_byte_size < 0:
            raise ValueError("--response-cache-byte-size must not be negative")
        size = size or args.response_cache_byte_size
    return size


def _log_level(args: argparse.Namespace) -> str:
    """``--log-level`` wins; else Triton's ``--log-verbose`` / ``--log-info`` / ``--log-warning`` / ``--log-error``."""
    if args.log_level:
        return str(args.log_level)
    if args.log_verbose > 0:
        return "debug"
    if args.log_info:
        return "info"
    if args.log_warning:
        return "warning"
    return "error"


def _start(argv: Sequence[str] | None, triton: bool) -> int:
    # first of all: Python models' stubs run as this user; they must not read this process's
    # descriptors (other models' tensors) or memory through /proc (backends/python/stub/dumpable.py)
    make_non_dumpable()
    parser = build_parser(triton)
    args = parser.parse_args(argv)
    prog = parser.prog
    warnings, errors = compat_notices(args)
    if errors:
        for message in errors:
            print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args, triton)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    control = LogControl(log_settings(args))
    control.configure()
    settings.log_control = control
    for message in warnings:
        log.warning("%s", message)
    return run(settings)


def main(argv: Sequence[str] | None = None) -> int:
    """``kubeinfer-server [flags]``, or ``kubeinfer-server tritonserver [Triton flags]`` (container args)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "tritonserver":
        return _start(args[1:], triton=True)
    return _start(args, triton=False)


def tritonserver_main(argv: Sequence[str] | None = None) -> int:
    """``tritonserver [Triton flags]``: Triton's defaults (exit on load errors, strict readiness)."""
    return _start(argv, triton=True)


if __name__ == "__main__":
    sys.exit(main())
