"""Serving benchmark: what dynamic batching buys, and how close the server gets to onnxruntime itself.

For the ResNet-18 CIFAR model and add_sub, each served with and without dynamic batching, it drives a
real ``kubeinfer-server`` over HTTP (binary tensors) and gRPC with closed-loop concurrency 1, 4 and 16
(batch-1 requests; benchmarks/loadgen.py, in its own process) and reports throughput and p50/p90/p99.
It also measures the in-process limit (benchmarks/inprocess.py: onnxruntime's best throughput at any
batch size 1..64 on the same cores) and prints served/limit for ResNet-18 plus the batching gain for
both models. Results go to ``benchmarks/results/serving-<time>.json`` (git-ignored).

    .venv/bin/python benchmarks/serving.py [--seconds 6] [--protocols http,grpc] [--concurrency 1,4,16]

The machine is shared: compare numbers within one run; differences under ~15% between runs are noise.
This is a measurement, never a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support.server: the same real-process launcher the tests use

import results_file  # noqa: E402
from inprocess import measure, measure_one  # noqa: E402
from loadgen import Tensor  # noqa: E402

from tests.support.server import ServerProcess, start_server  # noqa: E402

MODELS = {
    # name: (input specs, output names, onnx builder)
    "resnet": (["input:FP32:3x32x32"], ["output"]),
    "add_sub": (["INPUT0:FP32:16", "INPUT1:FP32:16"], ["OUTPUT0", "OUTPUT1"]),
}


def write_repository(root: Path, max_batch: int, delay_us: int, instances: int, intra_op: int) -> Path:
    from kubeinfer.server.examples import models

    repo = root / "repo"
    onnx_models = {"resnet": models.resnet18_cifar(seed=0), "add_sub": models.add_sub(16)}
    for base, model in onnx_models.items():
        for batching in (True, False):
            name = f"{base}_{'batched' if batching else 'single'}"
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
            params = (
                f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{intra_op}" }} }}\n'
                if intra_op
                else ""
            )
            batcher = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n" if batching else ""
            (repo / name / "config.pbtxt").write_text(
                textwrap.dedent(f"""\
                name: "{name}"
                platform: "onnxruntime_onnx"
                max_batch_size: {max_batch}
                instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
                """)
                + batcher
                + params
            )
    (root / "resnet.onnx").write_bytes(onnx_models["resnet"].SerializeToString())
    (root / "add_sub.onnx").write_bytes(onnx_models["add_sub"].SerializeToString())
    return repo


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()


def drive(
    server: ServerProcess, protocol: str, model: str, base: str, concurrency: int, seconds: float, warmup: float
) -> dict[str, Any]:
    inputs, outputs = MODELS[base]
    port = server.http_port if protocol == "http" else server.grpc_port
    cmd = [
        sys.executable,
        str(HERE / "loadgen.py"),
        "--protocol",
        protocol,
        "--url",
        f"127.0.0.1:{port}",
        "--model",
        model,
        "--concurrency",
        str(concurrency),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup),
    ]
    for spec in inputs:
        cmd += ["--input", spec]
    for name in outputs:
        cmd += ["--output", name]
    before = _stats(server, model)["model_stats"][0]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    after = _stats(server, model)["model_stats"][0]
    executions = after["execution_count"] - before["execution_count"]
    inferences = after["inference_count"] - before["inference_count"]
    result["avg_batch"] = round(inferences / executions, 2) if executions else None
    return result


def limit_next_to(root: Path, base: str, best: dict[str, Any], seconds: float) -> float:
    inputs, _ = MODELS[base]
    return measure_one(
        str(root / f"{base}.onnx"),
        [Tensor.parse(s) for s in inputs],
        best["sessions"],
        best["threads_per_session"],
        best["batch"],
        seconds / 2,
        best["spinning"],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--limit-seconds", type=float, default=2.0, help="seconds per in-process batch size")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--models", default="resnet,add_sub")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--delay-us", type=int, default=0, help="max_queue_delay_microseconds of the batched models")
    p.add_argument("--instances", type=int, default=1, help="instance_group count")
    p.add_argument("--intra-op", type=int, default=0, help="intra_op_thread_count (0: the backend's default)")
    p.add_argument("--no-limit", action="store_true", help="skip the in-process limit")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    protocols = args.protocols.split(",")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    bases = args.models.split(",")

    report: dict[str, Any] = {
        **results_file.header(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "limit": {},
        "served": [],
    }
    with tempfile.TemporaryDirectory(prefix="kubeinfer-bench-") as tmp:
        root = Path(tmp)
        repo = write_repository(root, args.max_batch, args.delay_us, args.instances, args.intra_op)
        if not args.no_limit:
            for base in bases:
                inputs, _ = MODELS[base]
                batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= args.max_batch)
                lim = measure(
                    str(root / f"{base}.onnx"), [Tensor.parse(s) for s in inputs], batches, args.limit_seconds
                )
                report["limit"][base] = lim
                print(
                    f"in-process limit {base}: {lim['limit']:.0f}/s (batch {lim['best']['batch']}, "
                    f"{lim['best']['sessions']} session(s) x {lim['best']['threads_per_session']} thread(s))",
                    flush=True,
                )
        server = start_server(repo, log_dir=root)
        try:
            for base in bases:
                for variant in ("batched", "single"):
                    model = f"{base}_{variant}"
                    for protocol in protocols:
                        for c in concurrencies:
                            adjacent = []
                            best = report["limit"].get(base, {}).get("best")
                            if best and c == max(concurrencies):
                                adjacent.append(limit_next_to(root, base, best, args.seconds))
                            r = drive(server, protocol, model, base, c, args.seconds, args.warmup)
                            if adjacent:
                                adjacent.append(limit_next_to(root, base, best, args.seconds))
                                # the machine is shared: the limit measured right before and after this point
                                r["adjacent_limit"] = round(sum(adjacent) / 2, 1)
                            r["base"], r["batching"] = base, variant == "batched"
                            report["served"].append(r)
                            print(
                                f"{model:16} {protocol:4} c={c:<3} {r['throughput']:8.1f}/s  p50 {r['p50_ms']}ms "
                                f"p90 {r['p90_ms']}ms p99 {r['p99_ms']}ms  avg batch {r['avg_batch']}  "
                                f"errors {r['errors']}"
                                + (f"  limit next to it {r['adjacent_limit']}/s" if "adjacent_limit" in r else ""),
                                flush=True,
                            )
        finally:
            server.terminate()
    report["summary"] = summarize(report, max(concurrencies))
    for line in report["summary"]["lines"]:
        print(line)
    out = results_file.write(report, "serving", args.output)
    print(f"wrote {out}")
    return 0


def summarize(report: dict[str, Any], top: int) -> dict[str, Any]:
    lines: list[str] = []
    summary: dict[str, Any] = {"ratio_to_limit": {}, "batching_gain": {}}

    def point(base: str, batching: bool, protocol: str) -> dict[str, Any]:
        for r in report["served"]:
            if (r["base"], r["batching"], r["protocol"], r["concurrency"]) == (base, batching, protocol, top):
                return r
        return {}

    def tput(base: str, batching: bool, protocol: str) -> float | None:
        r = point(base, batching, protocol)
        return float(r["throughput"]) if r else None

    for base in {r["base"] for r in report["served"]}:
        for protocol in sorted({r["protocol"] for r in report["served"]}):
            on, off = tput(base, True, protocol), tput(base, False, protocol)
            if on and off:
                gain = round(on / off, 2)
                summary["batching_gain"][f"{base}/{protocol}"] = gain
                lines.append(f"batching gain {base} {protocol} c={top}: {gain}x ({on:.0f}/s vs {off:.0f}/s)")
            if base == "resnet":
                for label, batching in (("with batching", True), ("without batching", False)):
                    r = point(base, batching, protocol)
                    limit = r.get("adjacent_limit") or report["limit"].get(base, {}).get("limit")
                    if r and limit:
                        ratio = round(r["throughput"] / limit, 3)
                        summary["ratio_to_limit"][f"{base}/{protocol}/{label}"] = ratio
                        lines.append(
                            f"served/limit {base} {protocol} c={top} {label}: {ratio:.0%} "
                            f"({r['throughput']:.0f}/s of {limit:.0f}/s measured next to it)"
                        )
    summary["lines"] = lines
    return summary


if __name__ == "__main__":
    sys.exit(main())
