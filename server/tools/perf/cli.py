"""The ``kubeinfer perf`` command line (perf_analyzer's flag names where they overlap) and its run."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ...vocabulary.server_defaults import GRPC_PORT, HTTP_PORT
from . import report, wire
from .load import Level, Setup, WorkerPool
from .measure import Plan, measure_level
from .model import PerfError, input_steps, model_info, parse_shapes, resolve_shapes
from .server import CpuProbe, ServerApi

DEFAULT_URL = {"http": f"localhost:{HTTP_PORT}", "grpc": f"localhost:{GRPC_PORT}"}


def parse_range(text: str, kind: type[Any], flag: str) -> list[Any]:
    """``start[:end[:step]]`` → the values from start to end inclusive."""
    parts = text.split(":")
    try:
        values = [kind(p) for p in parts]
    except ValueError:
        raise PerfError(f"{flag} {text!r}: expected start[:end[:step]] with numbers") from None
    if len(values) > 3 or any(v <= 0 for v in values):
        raise PerfError(f"{flag} {text!r}: expected start[:end[:step]] with positive numbers")
    start = values[0]
    end = values[1] if len(values) > 1 else start
    step = values[2] if len(values) > 2 else (1 if kind is int else start)
    if end < start:
        raise PerfError(f"{flag} {text!r}: the end is below the start")
    out = []
    value = start
    while value <= end * (1 + 1e-9):
        out.append(value)
        value += step
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument("-m", "--model-name", dest="model", required=True, help="the model to load-test")
    g.add_argument("-x", "--model-version", dest="version", default="", help="its version (default: the server's)")
    g.add_argument(
        "-u", "--url", default=None, help=f"host:port (default localhost:{HTTP_PORT} for HTTP, :{GRPC_PORT} for gRPC)"
    )
    g.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http")
    g.add_argument("-H", "--header", action="append", default=[], help="'Name: value' sent with every request")
    g.add_argument("--streaming", action="store_true", help="gRPC: send over ModelStreamInfer streams")
    g.add_argument("--ssl-grpc-use-ssl", action="store_true", help="gRPC over TLS (perf_analyzer's flags)")
    g.add_argument("--ssl-grpc-root-certifications-file", type=Path, default=None, help="CA of the server (PEM)")
    g.add_argument("--ssl-grpc-private-key-file", type=Path, default=None, help="client key, for mTLS (PEM)")
    g.add_argument("--ssl-grpc-certificate-chain-file", type=Path, default=None, help="client certificate (PEM)")
    g = p.add_argument_group("requests")
    g.add_argument("-b", "--batch-size", type=int, default=1)
    g.add_argument("--shape", action="append", default=[], help="NAME:d1,d2 for inputs with variable dims")
    g.add_argument(
        "--input-data",
        default="random",
        help="random | zero | a JSON file (perf_analyzer format) | a folder of NAME.npy",
    )
    g.add_argument("--string-length", type=int, default=128, help="length of random BYTES elements")
    g.add_argument("--input-tensor-format", choices=["binary", "json"], default="binary")
    g.add_argument("--output-tensor-format", choices=["binary", "json"], default="binary")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency-range", default=None, help="start:end:step requests in flight (closed loop)")
    g.add_argument("--request-rate-range", default=None, help="start:end:step requests/s (open loop)")
    g.add_argument("--request-distribution", choices=["constant", "poisson"], default="constant")
    g.add_argument("--max-threads", type=int, default=16, help="open loop: most requests in flight")
    g.add_argument("--processes", type=int, default=1, help="load processes (when one core cannot keep up)")
    g = p.add_argument_group("measurement")
    g.add_argument("-p", "--measurement-interval", type=int, default=5000, help="window length in ms")
    g.add_argument("--warmup-seconds", type=float, default=2.0, help="load before the first window")
    g.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    g.add_argument("-r", "--max-trials", type=int, default=10, help="most windows per level")
    g.add_argument("--percentile", type=int, default=95, help="the latency percentile the stability rule watches")
    g.add_argument("--server-pid", type=int, default=None, help="a local server's PID: report its CPU per request")
    g = p.add_argument_group("output")
    g.add_argument("-f", "--latency-report-file", dest="csv", type=Path, default=None, help="CSV file")
    g.add_argument("--json", type=Path, default=None, help="JSON file (one entry per level)")
    g.add_argument("--plot", type=Path, default=None, help="PNG: latency against throughput")
    g.add_argument("-q", "--quiet", action="store_true", help="no per-window progress on stderr")


def _headers(specs: list[str]) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, value = spec.partition(":")
        if not sep or not name.strip():
            raise PerfError(f"-H {spec!r}: expected 'Name: value'")
        out.append((name.strip(), value.strip()))
    return out


def _levels(args: argparse.Namespace) -> list[Level]:
    if args.concurrency_range and args.request_rate_range:
        raise PerfError("give --concurrency-range or --request-rate-range, not both")
    if args.request_rate_range:
        if args.streaming:
            raise PerfError("--streaming measures closed-loop concurrency only; use --concurrency-range")
        rates = parse_range(args.request_rate_range, float, "--request-rate-range")
        return [Level(rate=r, distribution=args.request_distribution, max_inflight=args.max_threads) for r in rates]
    return [Level(concurrency=c) for c in parse_range(args.concurrency_range or "1", int, "--concurrency-range")]


def _grpc_tls(args: argparse.Namespace) -> tuple[bytes | None, bytes | None, bytes | None] | None:
    """perf_analyzer's --ssl-grpc-* files, read: (root certificates, client key, client chain), or None."""
    if not args.ssl_grpc_use_ssl:
        return None
    files = (
        args.ssl_grpc_root_certifications_file,
        args.ssl_grpc_private_key_file,
        args.ssl_grpc_certificate_chain_file,
    )
    return tuple(f.read_bytes() if f else None for f in files)  # type: ignore[return-value]


def run(args: argparse.Namespace) -> int:
    protocol = args.protocol
    url = args.url or DEFAULT_URL[protocol]
    if "://" in url:
        url = url.split("://", 1)[1]
    host, _, port = url.rpartition(":")
    if not host or not port.isdigit():
        raise PerfError(f"-u {url!r}: expected host:port")
    if args.streaming and protocol != "grpc":
        raise PerfError("--streaming needs -i grpc")
    if args.processes < 1:
        raise PerfError("--processes must be at least 1")
    headers = _headers(args.header)
    levels = _levels(args)
    progress = None if args.quiet else sys.stderr
    tls = _grpc_tls(args) if protocol == "grpc" else None
    api = ServerApi(protocol, url, [(k.lower(), v) for k, v in headers] if protocol == "grpc" else headers, tls)
    try:
        info = model_info(
            api.metadata(args.model, args.version), api.config(args.model, args.version), args.model, args.version
        )
        dims = resolve_shapes(info, parse_shapes(args.shape))
        steps = input_steps(info, dims, args.input_data, args.batch_size, args.string_length)
        declared = {i.name: i.datatype for i in info.inputs}
        if protocol == "http":
            requests = tuple(
                wire.http_request(
                    url,
                    args.model,
                    args.version,
                    step,
                    declared,
                    (),
                    args.input_tensor_format == "binary",
                    args.output_tensor_format == "binary",
                    headers,
                )
                for step in steps
            )
        else:
            requests = tuple(
                wire.grpc_request(args.model, args.version, step, declared, (), args.input_tensor_format == "binary")
                for step in steps
            )
        plan = Plan(
            model=args.model,
            version=args.version,
            batch_size=args.batch_size if info.max_batch_size else 1,
            window_s=args.measurement_interval / 1000,
            warmup_s=args.warmup_seconds,
            stability=args.stability_percentage,
            max_trials=args.max_trials,
            percentile=args.percentile,
        )
        cpu = CpuProbe(args.server_pid) if args.server_pid else None
        metadata = tuple((k.lower(), v) for k, v in headers)
        setups = [
            Setup(protocol, host, int(port), requests, args.streaming, metadata, seed=0, index=i, tls=tls)
            for i in range(args.processes)
        ]
        if progress is not None:
            print(
                f"kubeinfer perf: {args.model} over {protocol} at {url}, batch {plan.batch_size}, "
                f"{len(levels)} level(s), {args.processes} load process(es)",
                file=progress,
                flush=True,
            )
        results = []
        started = time.time()
        with WorkerPool(setups) as pool:
            for i, level in enumerate(levels):
                if progress is not None and len(levels) > 1:
                    print(
                        f"level {i + 1}/{len(levels)} ({time.time() - started:.0f}s so far)", file=progress, flush=True
                    )
                results.append(measure_level(pool, api, plan, level, cpu, progress))
    finally:
        api.close()
    document = {
        "model": args.model,
        "version": args.version,
        "protocol": protocol,
        "url": url,
        "batch_size": plan.batch_size,
        "streaming": args.streaming,
        "input_tensor_format": args.input_tensor_format,
        "output_tensor_format": args.output_tensor_format,
        "processes": args.processes,
        "settings": {
            "measurement_interval_ms": args.measurement_interval,
            "warmup_seconds": args.warmup_seconds,
            "stability_percentage": args.stability_percentage,
            "max_trials": args.max_trials,
            "percentile": args.percentile,
        },
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "levels": results,
    }
    print(report.table(results, args.percentile))
    if args.json:
        report.write_json(args.json, document)
    if args.csv:
        report.write_csv(args.csv, results)
    if args.plot:
        report.plot(args.plot, {f"{args.model} {protocol}": results}, f"{args.model} over {protocol} ({url})")
    return 1 if any(r["total_errors"] for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubeinfer perf", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except PerfError as exc:
        print(f"kubeinfer perf: error: {exc}", file=sys.stderr)
        return 2
