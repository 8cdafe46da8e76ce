"""What the confined walk (``kubeinfer.server.repository.confined``) costs next to one ``openat2`` and a plain open.

Opens ``<tmp>/a/b/c/d/model.onnx`` (5 components) beneath a folder descriptor many times, each way:

* ``plain``: ``os.open`` of the path by name (what the code did before: no confinement at all);
* ``walk``: ``confined.open_file`` without symlinks (the operator's mode);
* ``walk_follow``: ``confined.open_file`` taking inside symlinks (the server's mode), through one symlink;
* ``openat2``: one ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` system call through ctypes, where the
  kernel has it (Linux 5.6+).

Prints microseconds per open and writes ``benchmarks/results/confined-walk-<time>.json``.

    .venv/bin/python benchmarks/confined_walk.py [--opens 20000]

A measurement, never a test. Compare within one run; the machine is shared.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubeinfer.server.repository import confined

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import header, write

SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x04, 0x08


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2_open(libc: Any, dir_fd: int, path: bytes) -> int:
    how = OpenHow(os.O_RDONLY | os.O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
    fd = int(libc.syscall(SYS_OPENAT2, dir_fd, path, ctypes.byref(how), ctypes.sizeof(how)))
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return fd


def timed(opens: int, open_one: Any) -> float:
    started = time.perf_counter()
    for _ in range(opens):
        os.close(open_one())
    return (time.perf_counter() - started) / opens * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "a" / "b" / "c" / "d").mkdir(parents=True)
        (root / "a" / "b" / "c" / "d" / "model.onnx").write_bytes(b"x" * 1024)
        os.symlink("d", root / "a" / "b" / "c" / "link")
        root_fd = confined.open_root(root)
        rel = "a/b/c/d/model.onnx"
        libc = ctypes.CDLL(None, use_errno=True)
        results: dict[str, float | str] = {}
        for _ in range(2):  # the first round warms caches; the second is reported
            results["plain"] = timed(args.opens, lambda: os.open(root / rel, os.O_RDONLY | os.O_CLOEXEC))
            results["walk"] = timed(args.opens, lambda: confined.open_file(root_fd, rel))
            results["walk_follow"] = timed(
                args.opens, lambda: confined.open_file(root_fd, "a/b/c/link/model.onnx", follow=True)
            )
            if SYS_OPENAT2 is None:
                results["openat2"] = f"no syscall number known for {platform.machine()}"
                continue
            try:
                os.close(openat2_open(libc, root_fd, rel.encode()))
            except OSError as exc:
                results["openat2"] = f"unavailable: {exc.strerror}"
                continue
            results["openat2"] = timed(args.opens, lambda: openat2_open(libc, root_fd, rel.encode()))
        os.close(root_fd)
    report = header() | {"kernel": platform.release(), "components": 5, "opens": args.opens, "microseconds": results}
    for name, value in results.items():
        print(f"{name:12s} {value:.2f} us" if isinstance(value, float) else f"{name:12s} {value}")
    print(f"wrote {write(report, 'confined-walk')}")


if __name__ == "__main__":
    main()
