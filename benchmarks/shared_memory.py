"""What system shared memory gains over binary HTTP and gRPC for large tensors (3×224×224 FP32 images).

Two ONNX models with almost no compute, so the cost measured is moving the tensors: ``image_to_image``
(Neg: 602 KB in, 602 KB out) and ``image_to_vector`` (ReduceMean over H and W: 602 KB in, 12 bytes out).
Each is driven closed-loop at concurrency 8 (batch-1 requests; benchmarks/loadgen.py in its own process)
four ways — HTTP binary tensors, gRPC raw contents, and the same two with every tensor in a system
shared-memory region of the connection's own (tritonclient's helpers, registered over the same
protocol). The ratios are shared-memory throughput over the plain protocol's, measured in one run.
Results go to ``benchmarks/results/shared-memory-<time>.json`` (git-ignored).

    .venv/bin/python benchmarks/shared_memory.py [--seconds 6] [--concurrency 8] [--rounds 2]

Rounds alternate the four ways so that drift on the shared machine hits each of them alike; the best
round per way is reported. This is a measurement, never a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support: the same real-process launcher the tests use

import results_file  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from tests.support.server import ServerProcess, start_server  # noqa: E402

IMAGE = "IMAGE:FP32:3x224x224"
MODELS = {
    "image_to_image": ([IMAGE], ["OUT:FP32:3x224x224"]),
    "image_to_vector": ([IMAGE], ["OUT:FP32:3"]),
}


def _onnx(name: str) -> bytes:
    x = helper.make_tensor_value_info("IMAGE", TensorProto.FLOAT, ["batch", 3, 224, 224])
    if name == "image_to_image":
        node = helper.make_node("Neg", ["IMAGE"], ["OUT"])
        y = helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 3, 224, 224])
    else:
        node = helper.make_node("ReduceMean", ["IMAGE"], ["OUT"], axes=[2, 3], keepdims=0)
        y = helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 3])
    model = helper.make_model(helper.make_graph([node], name, [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def write_repository(root: Path) -> Path:
    repo = root / "repo"
    for name, (_, outputs) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(_onnx(name))
        dims = outputs[0].split(":")[2].replace("x", ", ")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
            'input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]\n'
            f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
            'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
        )
    return repo


def drive(
    server: ServerProcess, protocol: str, shm: bool, model: str, concurrency: int, seconds: float
) -> dict[str, Any]:
    inputs, outputs = MODELS[model]
    port = server.http_port if protocol == "http" else server.grpc_port
    cmd = [sys.executable, str(HERE / "loadgen.py"), "--protocol", protocol, "--url", f"127.0.0.1:{port}"]
    cmd += ["--model", model, "--concurrency", str(concurrency), "--seconds", str(seconds), "--warmup", "1"]
    for spec in inputs:
        cmd += ["--input", spec]
    for spec in outputs:
        cmd += ["--output", spec]
    if shm:
        cmd.append("--shared-memory")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    ways = [("http", False), ("http", True), ("grpc", False), ("grpc", True)]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = start_server(write_repository(root), "--allow-client-shm=true", log_dir=root)
        try:
            for round_ in range(args.rounds):
                for model in MODELS:
                    for protocol, shm in ways:
                        r = drive(server, protocol, shm, model, args.concurrency, args.seconds)
                        r["round"] = round_
                        runs.append(r)
                        print(
                            f"round {round_} {model:16s} {protocol:4s} {'shm ' if shm else 'wire'} "
                            f"{r['throughput']:8.1f}/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  "
                            f"errors {r['errors']} {r['first_error'][:80]}",
                            flush=True,
                        )
        finally:
            server.terminate()
    best: dict[tuple[str, str, bool], dict[str, Any]] = {}
    for r in runs:
        key = (r["model"], r["protocol"], r["shared_memory"])
        if key not in best or r["throughput"] > best[key]["throughput"]:
            best[key] = r
    summary = []
    print(f"\nconcurrency {args.concurrency}, best of {args.rounds} rounds (requests/s, one image per request)")
    print(f"{'model':16s} {'protocol':8s} {'wire':>9s} {'shm':>9s} {'shm/wire':>9s} {'p50 wire':>9s} {'p50 shm':>8s}")
    for model in MODELS:
        for protocol in ("http", "grpc"):
            wire, sm = best[(model, protocol, False)], best[(model, protocol, True)]
            ratio = sm["throughput"] / wire["throughput"] if wire["throughput"] else None
            summary.append(
                {
                    "model": model,
                    "protocol": protocol,
                    "wire_per_s": wire["throughput"],
                    "shm_per_s": sm["throughput"],
                    "shm_over_wire": round(ratio, 2) if ratio else None,
                    "wire_p50_ms": wire["p50_ms"],
                    "shm_p50_ms": sm["p50_ms"],
                }
            )
            print(
                f"{model:16s} {protocol:8s} {wire['throughput']:9.1f} {sm['throughput']:9.1f} "
                f"{(ratio or 0):8.2f}x {wire['p50_ms']:9} {sm['p50_ms']:8}"
            )
    report = {
        **results_file.header(),
        "python": platform.python_version(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "summary": summary,
        "runs": runs,
    }
    path = results_file.write(report, "shared-memory", indent=2)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
