"""What reading tensors through the descriptor (pread/pwrite) costs against views of a mapping.

System shared-memory regions were mapped and inputs handed out as views (zero copy); a client that
truncated its object then took the server down with SIGBUS. ``sharedmemory/system.py`` now keeps the
descriptor and copies: ``fstat`` + ``preadv`` for an input, ``fstat`` + ``pwrite`` for an output. This
times both ways in one process on one /dev/shm object, per tensor size:

* ``read``: getting the input tensor (mapping: a view; descriptor: a copy), then one pass over it (a sum,
  standing in for the model's first read of its input — a view's page faults are paid there);
* ``write``: putting an output of that size into the region (mapping: a slice assignment; descriptor:
  ``pwrite``).

    .venv/bin/python benchmarks/shm_access.py [--repeat 7]

Results go to ``benchmarks/results/shm-access-<time>.json``. A measurement, never a test.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import timeit
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import results_file  # noqa: E402
from kubeinfer.server.sharedmemory.system import open_region  # noqa: E402

SIZES = [4 << 10, 64 << 10, 602_112, 4 << 20, 16 << 20]  # 602,112: one 3x224x224 FP32 image


def measure(size: int, repeat: int) -> dict[str, Any]:
    key = f"kubeinfer_bench_{os.getpid()}_{size}"
    path = f"/dev/shm/{key}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
        mapping[:] = np.random.default_rng(0).random(size // 4, np.float32).tobytes()
        view = memoryview(mapping)
        region = open_region("bench", "/" + key, 0, size)
        out = np.ones(size // 4, np.float32)
        count = size // 4

        def read_mapped() -> float:
            return float(np.ndarray((count,), np.float32, view[:size]).sum())

        def read_fd() -> float:
            return float(np.ndarray((count,), np.float32, region.read(0, size)).sum())

        def write_mapped() -> None:
            view[:size] = out.data.cast("B")

        def write_fd() -> None:
            region.write(0, out.data.cast("B"))

        assert read_mapped() == read_fd()
        number = max(1, int(2e7 // size))  # ~20 MB moved per timing
        row: dict[str, Any] = {"bytes": size, "calls_per_timing": number}
        cases = {"read_mapped": read_mapped, "read_fd": read_fd, "write_mapped": write_mapped, "write_fd": write_fd}
        for name, fn in cases.items():
            best = min(timeit.repeat(fn, number=number, repeat=repeat)) / number
            row[f"{name}_us"] = round(best * 1e6, 2)
        row["read_ratio"] = round(row["read_fd_us"] / row["read_mapped_us"], 2)
        row["write_ratio"] = round(row["write_fd_us"] / row["write_mapped_us"], 2)
        view.release()
        mapping.close()
        region.close()
        return row
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timings per case; the best is kept")
    args = parser.parse_args()
    report = results_file.header()
    report["rows"] = [measure(size, args.repeat) for size in SIZES]
    for row in report["rows"]:
        print(
            f"{row['bytes']:>10} B  read {row['read_mapped_us']:>9.2f} -> {row['read_fd_us']:>9.2f} us "
            f"(x{row['read_ratio']})   write {row['write_mapped_us']:>9.2f} -> {row['write_fd_us']:>9.2f} us "
            f"(x{row['write_ratio']})"
        )
    print(results_file.write(report, "shm-access"))


if __name__ == "__main__":
    main()
