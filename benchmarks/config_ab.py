"""A/B of config.pbtxt variants of one model on kubeinfer, interleaved in one run.

Each variant is a server of its own (all up at once) serving ResNet-18 CIFAR with the peers' settings
(``benchmarks/peers/peers.py``: max batch 64, no queue delay, one instance) plus the variant's extra
config text; for every round, point (protocol, concurrency) and variant in turn (who goes first
alternates), ``kubeinfer perf`` measures throughput, p50, the server's average batch, execution time and
CPU per request. Each round also measures onnxruntime in-process at batch 1 (one session, all threads,
spinning on and off): the yardstick of a client at concurrency 1. Medians print at the end; the report
goes to ``benchmarks/results/config-ab-<time>.json``.

    .venv/bin/python benchmarks/config_ab.py \\
        --variant 'default=' \\
        --variant 'spin=parameters { key: "allow_spinning" value: { string_value: "1" } }' \\
        --points grpc:1,http:1,grpc:16,http:16 --rounds 3

A measurement, never a test: nothing asserts a speed. Compare within one run; the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE))

import peers  # noqa: E402
import results_file  # noqa: E402
from inprocess import measure_one  # noqa: E402
from loadgen import Tensor  # noqa: E402

MODEL = "resnet18"


def perf(peer: peers.Peer, protocol: str, concurrency: int, out: Path) -> dict[str, Any]:
    port = peer.http_port if protocol == "http" else peer.grpc_port
    command = [sys.executable, "-m", "kubeinfer.server.tools.cli", "perf", "-q", "-m", MODEL, "-i", protocol]
    command += ["-u", f"127.0.0.1:{port}", "--concurrency-range", str(concurrency), "-p", "2000", "-r", "3"]
    command += ["--warmup-seconds", "1", "--server-pid", str(peer.pid), "--json", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    (level,) = json.loads(out.read_text())["levels"]
    out.unlink()
    return dict(level)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="NAME=extra config.pbtxt text (may be empty)")
    p.add_argument("--points", default="grpc:1,http:1,grpc:16,http:16", help="protocol:concurrency,...")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    variants = dict(v.split("=", 1) for v in args.variant)
    points = [(proto, int(c)) for proto, c in (x.split(":") for x in args.points.split(","))]
    from kubeinfer.server.examples import models as examples

    report: dict[str, Any] = {**results_file.header(), "variants": variants, "points": [], "in_process": []}
    with tempfile.TemporaryDirectory(prefix="kubeinfer-config-ab-") as tmp:
        root = Path(tmp)
        onnx = root / f"{MODEL}.onnx"
        onnx.write_bytes(examples.resnet18_cifar(seed=0).SerializeToString())
        running: dict[str, peers.Peer] = {}
        try:
            for name, extra in variants.items():
                folder = root / name / MODEL
                (folder / "1").mkdir(parents=True)
                (folder / "1" / "model.onnx").write_bytes(onnx.read_bytes())
                (folder / "config.pbtxt").write_text(peers.config_pbtxt(MODEL, 'platform: "onnxruntime_onnx"', extra))
                (root / name / "logs").mkdir()
                running[name] = peers.start_kubeinfer(folder.parent, root / name / "logs")
            for peer in running.values():
                peer.wait([MODEL])
            tensors = [Tensor("input", "FP32", [1, 3, 32, 32])]
            for rnd in range(args.rounds):
                for spinning in (False, True):
                    value = measure_one(str(onnx), tensors, 1, 2, 1, 2.0, spinning)
                    report["in_process"].append({"round": rnd, "spinning": spinning, "throughput": value})
                    print(f"round {rnd + 1}: in-process batch 1, 1 session, spinning {spinning}: {value}/s", flush=True)
                for protocol, c in points:
                    names = list(running) if rnd % 2 == 0 else list(reversed(running))
                    for name in names:
                        level = perf(running[name], protocol, c, root / "point.json")
                        report["points"].append(
                            {"round": rnd, "variant": name, "protocol": protocol, "concurrency": c, "level": level}
                        )
                        s = level["server"]
                        print(
                            f"round {rnd + 1}: {protocol} c={c} {name}: {level['throughput']:.1f}/s "
                            f"p50 {level['p50_ms']} ms, batch {s['avg_batch']}, "
                            f"execution {s['compute_infer_us'] / 1000:.1f} ms, "
                            f"CPU {level['server_cpu']['us_per_request']:.0f} µs/req",
                            flush=True,
                        )
        finally:
            for peer in running.values():
                peer.stop()
    print()
    for protocol, c in points:
        for name in variants:
            values = [
                pt["level"]["throughput"]
                for pt in report["points"]
                if (pt["variant"], pt["protocol"], pt["concurrency"]) == (name, protocol, c)
            ]
            print(f"{protocol} c={c} {name}: median {statistics.median(values):.1f}/s of {values}")
    out = results_file.write(report, "config-ab", args.output)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
