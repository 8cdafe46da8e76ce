"""``kubeinfer-server``: command-line flags (Triton's names where Triton has one)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .app import ServerSettings, run
from .vocabulary.limits import DEFAULT_LIMITS, Limits


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubeinfer-server",
        description="Serve a Triton-style model repository over KServe v2 HTTP and gRPC.",
    )
    p.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="model repository folder (default: the bundled example repository, generated on first use)",
    )
    p.add_argument("--host", default="0.0.0.0", help="address to bind HTTP, gRPC and metrics to")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--allow-http", type=_bool, default=True)
    p.add_argument("--allow-grpc", type=_bool, default=True)
    p.add_argument("--allow-metrics", type=_bool, default=True)
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    p.add_argument("--repository-poll-secs", type=float, default=15.0)
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: model to load at start ('*' for all); repeatable",
    )
    p.add_argument(
        "--strict-readiness",
        type=_bool,
        default=False,
        help="/v2/health/ready only when every model in the repository is ready",
    )
    p.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="seconds to let in-flight requests finish after SIGTERM"
    )
    _limit_flags(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


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
    )


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{value}'") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{value}'")
    return n


def _bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    repo = args.model_repository
    if repo is None:
        from .examples.generate import default_repository

        repo = default_repository()
    if not repo.is_dir():
        print(f"kubeinfer-server: model repository '{repo}' is not a folder", file=sys.stderr)
        return 2
    settings = ServerSettings(
        model_repository=repo.resolve(),
        host=args.host,
        http_port=args.http_port if args.allow_http else None,
        grpc_port=args.grpc_port if args.allow_grpc else None,
        metrics_port=args.metrics_port if args.allow_metrics else None,
        control_mode=args.model_control_mode,
        poll_secs=args.repository_poll_secs,
        load_models=tuple(args.load_model),
        strict_readiness=args.strict_readiness,
        shutdown_timeout=args.shutdown_timeout,
        limits=_limits(args),
        log_level=args.log_level,
    )
    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
