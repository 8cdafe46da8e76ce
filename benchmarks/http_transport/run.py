"""HTTP transports compared in one run: uvicorn (``--http-transport asgi``, with its direct infer path) and the
native one (``--http-transport native``, issue 39).

    .venv/bin/python benchmarks/http_transport/run.py [--rounds 5] [--window-ms 2000]

Two servers, both up at once, on the same add_sub ONNX file (16 FP32 elements, no batching). Each point is
``kubeinfer perf -i http`` (closed loop, batch-1, binary tensors, the server's process CPU per request) at
concurrency 1 and 16, servers in turn within each round, ``--rounds`` rounds, medians. Prints the medians and
writes ``benchmarks/results/http-transport-<time>.json``. A measurement, never a test: nothing asserts a speed.
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
sys.path.insert(0, str(HERE.parent))  # results_file
sys.path.insert(0, str(HERE.parents[1]))  # tests.support.server: the launcher the tests use

import results_file  # noqa: E402

from tests.support.server import ServerProcess, start_server  # noqa: E402

TRANSPORTS = ("asgi", "native")
CONCURRENCY = (1, 16)


def repository(root: Path) -> Path:
    from kubeinfer.server.examples import models

    repo = root / "repo"
    (repo / "add_sub" / "1").mkdir(parents=True)
    (repo / "add_sub" / "1" / "model.onnx").write_bytes(models.add_sub(16).SerializeToString())
    (repo / "add_sub" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    return repo


def point(server: ServerProcess, concurrency: int, window_ms: int, out: Path) -> dict[str, Any]:
    """One ``kubeinfer perf`` level against ``server``."""
    command = [
        sys.executable, "-m", "kubeinfer.server.tools.cli", "perf", "-m", "add_sub",
        "-u", f"127.0.0.1:{server.http_port}", "-i", "http",
        "--shape", "INPUT0:1,16", "--shape", "INPUT1:1,16",
        "--concurrency-range", str(concurrency), "-p", str(window_ms), "--warmup-seconds", "1", "-r", "3",
        "--server-pid", str(server.proc.pid), "--json", str(out), "-q",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"kubeinfer perf failed: {done.stderr}")
    level: dict[str, Any] = json.loads(out.read_text())["levels"][0]
    return level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=2000)
    args = parser.parse_args()
    report = results_file.header()
    root = Path(tempfile.mkdtemp(prefix="http-transport-"))
    repo = repository(root)
    servers = {t: start_server(repo, "--http-transport", t, log_dir=root) for t in TRANSPORTS}
    points: dict[str, list[dict[str, Any]]] = {}
    try:
        for r in range(args.rounds):
            for concurrency in CONCURRENCY:
                for transport, server in servers.items():
                    level = point(server, concurrency, args.window_ms, root / f"{transport}-{concurrency}-{r}.json")
                    points.setdefault(f"{transport}@{concurrency}", []).append(level)
    finally:
        for server in servers.values():
            server.terminate()
    medians = {
        key: {
            "server_us_per_request": statistics.median(p["server_cpu"]["us_per_request"] for p in levels),
            "throughput": statistics.median(p["throughput"] for p in levels),
            "p50_ms": statistics.median(p["p50_ms"] for p in levels),
        }
        for key, levels in points.items()
    }
    report.update(rounds=args.rounds, window_ms=args.window_ms, medians=medians, points=points)
    for key, median in sorted(medians.items()):
        print(f"{key:10} {json.dumps(median)}")
    print(results_file.write(report, "http-transport"))


if __name__ == "__main__":
    main()
