"""In-process Python models vs a worker process: what isolation costs on a batch of images.

Runs the CIFAR ``preprocessor`` (examples/python_models/preprocessor.py) on a batch of UINT8 images
three ways and reports milliseconds per batch:

* ``in-process``: the call our Python backend makes (tensors passed by reference);
* ``worker+pipe``: a worker process, batch and result pickled through a pipe;
* ``worker+shm``: a worker process, batch copied into shared memory and the result copied out (what
  Triton's python backend stub does over /dev/shm).

    .venv/bin/python benchmarks/python_backend_isolation.py [--batch 32] [--height 240] [--width 320]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
import types
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from kubeinfer.server.examples import python_models


def _preprocess_fn() -> Any:
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    namespace: dict[str, Any] = {}
    exec(compile(python_models.source("preprocessor"), "preprocessor.py", "exec"), namespace)
    return namespace["preprocess"]


def _run(preprocess: Any, images: np.ndarray) -> np.ndarray:
    return np.stack([preprocess(img) for img in images])


def _pipe_worker(conn: Any) -> None:
    preprocess = _preprocess_fn()
    while True:
        images = conn.recv()
        if images is None:
            return
        conn.send(_run(preprocess, images))


def _shm_worker(conn: Any, in_name: str, out_name: str, shape: tuple[int, ...]) -> None:
    preprocess = _preprocess_fn()
    shm_in = shared_memory.SharedMemory(in_name)
    shm_out = shared_memory.SharedMemory(out_name)
    images = np.ndarray(shape, np.uint8, buffer=shm_in.buf)
    out = np.ndarray((shape[0], 3, 32, 32), np.float32, buffer=shm_out.buf)
    while conn.recv():
        out[...] = _run(preprocess, images)
        conn.send(True)
    del images, out
    shm_in.close()
    shm_out.close()


def _time(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    images = np.random.default_rng(0).integers(0, 256, (args.batch, args.height, args.width, 3), dtype=np.uint8)
    preprocess = _preprocess_fn()
    expected = _run(preprocess, images)
    results: dict[str, float] = {}

    results["in-process"] = _time(lambda: _run(preprocess, images), args.repeats)

    parent, child = mp.Pipe()
    worker = mp.get_context("spawn").Process(target=_pipe_worker, args=(child,))
    worker.start()

    def via_pipe() -> np.ndarray:
        parent.send(images)
        return parent.recv()

    assert np.array_equal(via_pipe(), expected)
    results["worker+pipe"] = _time(via_pipe, args.repeats)
    parent.send(None)
    worker.join()

    shm_in = shared_memory.SharedMemory(create=True, size=images.nbytes)
    shm_out = shared_memory.SharedMemory(create=True, size=expected.nbytes)
    parent, child = mp.Pipe()
    worker = mp.get_context("spawn").Process(target=_shm_worker, args=(child, shm_in.name, shm_out.name, images.shape))
    worker.start()
    staged = np.ndarray(images.shape, np.uint8, buffer=shm_in.buf)
    result_view = np.ndarray(expected.shape, np.float32, buffer=shm_out.buf)

    def via_shm() -> np.ndarray:
        staged[...] = images  # request tensors are copied in
        parent.send(True)
        parent.recv()
        return result_view.copy()  # and the response copied out

    assert np.array_equal(via_shm(), expected)
    results["worker+shm"] = _time(via_shm, args.repeats)
    parent.send(False)
    worker.join()
    staged = result_view = None  # release the buffer exports before closing the segments
    shm_in.close()
    shm_in.unlink()
    shm_out.close()
    shm_out.unlink()

    mb = images.nbytes / 1e6
    print(
        f"batch of {args.batch} UINT8 images {args.height}x{args.width}x3 ({mb:.1f} MB) → FP32 [3,32,32], "
        f"median of {args.repeats}"
    )
    base = results["in-process"]
    for name, ms in results.items():
        print(f"  {name:12s} {ms:8.2f} ms/batch   overhead vs in-process {ms - base:+7.2f} ms ({ms / base:.2f}x)")


if __name__ == "__main__":
    main()
