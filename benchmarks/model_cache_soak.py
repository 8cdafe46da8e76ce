"""Soak: load and unload one ONNX model 200 times; does unloading give its memory back?

A real server in explicit mode; each cycle is ``POST /v2/repository/models/m/load``, one inference (the
answer checked), ``.../unload``; the server's resident set (``VmRSS`` of its process) is read before the
first load, after the first cycle (the runtime's own start-up is in from then on) and every 20 cycles.
Two servers, one after the other: with the model cache (``--model-load-on-demand=true``: freed heap pages
go back to the system after each unload) and without it (plain explicit mode, as before).

The model is ResNet-18 for CIFAR-10 (the example repository's, ~45 MB of weights). Results go to
``benchmarks/results/model-cache-soak-<time>.json``. A measurement, never a test.

    .venv/bin/python benchmarks/model_cache_soak.py --cycles 200
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import results_file  # noqa: E402
from tests.support.drills import rss_bytes  # noqa: E402
from tests.support.repos import resnet_bytes, write_model  # noqa: E402
from tests.support.server import start_server  # noqa: E402

CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [{ count: 1 kind: KIND_CPU }]\n'


def soak(repo: Path, cycles: int, cache: bool) -> dict[str, object]:
    flags = ["--model-control-mode=explicit"] + (["--model-load-on-demand=true"] if cache else [])
    server = start_server(repo, *flags, log_dir=repo.parent)
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": x.ravel().tolist()}]}
    samples: list[tuple[int, int]] = []
    try:
        pid = server.proc.pid
        start = rss_bytes(pid)
        samples.append((0, start))
        started = time.monotonic()
        for cycle in range(1, cycles + 1):
            for path in ("load", None, "unload"):
                if path is None:
                    r = httpx.post(f"{server.base_url}/v2/models/m/infer", json=body, timeout=60)
                    r.raise_for_status()
                    assert len(r.json()["outputs"][0]["data"]) == 10
                else:
                    httpx.post(f"{server.base_url}/v2/repository/models/m/{path}", timeout=60).raise_for_status()
            if cycle == 1 or cycle % 20 == 0:
                time.sleep(0.2)  # the unload's drain and close finish in the background
                samples.append((cycle, rss_bytes(pid)))
                print(f"  cycle {cycle:4d}: RSS {samples[-1][1] / 2**20:7.1f} MiB", flush=True)
        seconds = time.monotonic() - started
    finally:
        server.terminate()
    after_first = samples[1][1]
    end = samples[-1][1]
    return {
        "model_cache": cache,
        "cycles": cycles,
        "seconds": round(seconds, 1),
        "rss_start_mib": round(start / 2**20, 1),
        "rss_after_first_cycle_mib": round(after_first / 2**20, 1),
        "rss_end_mib": round(end / 2**20, 1),
        "growth_after_first_cycle_mib": round((end - after_first) / 2**20, 1),
        "samples": [(c, round(b / 2**20, 1)) for c, b in samples],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, object] = {**results_file.header(), "model": "resnet18-cifar10 (onnx)", "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_model(repo, "m", CONFIG, {1: resnet_bytes()})
        runs = []
        for cache in (True, False):
            print(f"{'with' if cache else 'without'} the model cache:", flush=True)
            run = soak(repo, args.cycles, cache)
            runs.append(run)
            print(
                f"  RSS start {run['rss_start_mib']} MiB, after cycle 1 {run['rss_after_first_cycle_mib']} MiB, "
                f"after {args.cycles} cycles {run['rss_end_mib']} MiB "
                f"(growth after the first cycle {run['growth_after_first_cycle_mib']:+} MiB) in {run['seconds']} s",
                flush=True,
            )
        report["runs"] = runs
    print(results_file.write(report, "model-cache-soak", args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
