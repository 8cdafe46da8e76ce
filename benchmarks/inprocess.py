"""The in-process limit: onnxruntime's best throughput on this machine, with no server in the way.

Tries every batch size in ``batches`` with (a) one session using every core and (b) one session per core,
each on its own thread (what ``instance_group { count: N }`` does), each with onnxruntime's thread spinning
on (its default) and off, and returns each measurement plus the best rows/second. A server cannot beat
this number on the same cores; served/limit is its efficiency.

    .venv/bin/python benchmarks/inprocess.py model.onnx input:FP32:3x32x32 [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

import numpy as np
from loadgen import DTYPES, Tensor

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def _session(model_path: str, threads: int, spinning: bool = True) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])


def _feed(tensors: list[Tensor], batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t.name: rng.standard_normal([batch, *t.shape[1:]]).astype(DTYPES[t.datatype]) for t in tensors}


def measure_one(
    model_path: str,
    tensors: list[Tensor],
    sessions: int,
    threads: int,
    batch: int,
    seconds: float,
    spinning: bool = True,
) -> float:
    """Rows/second of one layout at one batch size (used to re-measure the best point next to a served one)."""
    return measure(model_path, tensors, (batch,), seconds, layouts=[(sessions, threads, spinning)])["limit"]


def measure(
    model_path: str,
    tensors: list[Tensor],
    batches: tuple[int, ...] = BATCHES,
    seconds: float = 3.0,
    cores: int | None = None,
    layouts: list[tuple[int, int, bool]] | None = None,
) -> dict[str, Any]:
    cores = cores or os.cpu_count() or 1
    points = []
    shapes = [(1, cores)] + ([(cores, 1)] if cores > 1 else [])
    layouts = layouts or [(n, t, spin) for n, t in shapes for spin in (True, False)]
    for sessions, threads, spinning in layouts:
        runners = [_session(model_path, threads, spinning) for _ in range(sessions)]
        for batch in batches:
            feed = _feed(tensors, batch)
            for s in runners:
                s.run(None, feed)  # warm up
            counts = [0] * sessions
            stop = time.perf_counter() + seconds

            def loop(
                i: int, stop: float = stop, feed: dict = feed, runners: list = runners, counts: list = counts
            ) -> None:
                while time.perf_counter() < stop:
                    runners[i].run(None, feed)
                    counts[i] += 1

            start = time.perf_counter()
            workers = [threading.Thread(target=loop, args=(i,)) for i in range(sessions)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - start
            points.append(
                {
                    "sessions": sessions,
                    "threads_per_session": threads,
                    "spinning": spinning,
                    "batch": batch,
                    "throughput": round(sum(counts) * batch / elapsed, 1),
                }
            )
    best = max(points, key=lambda p: p["throughput"])
    return {"points": points, "best": best, "limit": best["throughput"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("input", nargs="+", help="NAME:DATATYPE:DIMSxDIMS (no batch dim)")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.model, [Tensor.parse(s) for s in args.input], seconds=args.seconds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
