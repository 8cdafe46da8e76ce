"""What a model version costs in memory: host RSS and GPU memory, read before and after its load.

The difference between two readings belongs to the load between them when nothing else loaded or
unloaded meanwhile; the model cache (``model_cache``) lets loads overlap and tells which readings were
alone. Host memory is the process's resident set (``/proc/self/statm``); GPU memory is
this process's use per device as NVML reports it, or, where NVML cannot see this process (a container
with its own PID namespace), the device's used memory (other processes on the device blur it then).
After an unload ``release_free_memory`` hands glibc's freed pages back to the system, so that RSS
follows what is loaded (glibc keeps freed heap memory otherwise).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ..observability import nvml

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Footprint:
    """Bytes of host memory and of each GPU (device index → bytes)."""

    host: int = 0
    gpu: dict[int, int] = field(default_factory=dict)
    #: bytes malloc has handed out and not got back (a reading's, not a difference's)
    heap: int = 0

    def minus(self, before: Footprint) -> Footprint:
        """The growth from ``before`` to this reading (never negative: a load does not free memory).

        Host growth is the larger of RSS growth and malloc'd growth: RSS misses memory a load takes from
        pages freed earlier (an evicted model's), malloc's count misses what is mapped past malloc (files,
        Python's own arenas); each catches what the other misses."""
        gpu = {d: max(0, b - before.gpu.get(d, 0)) for d, b in self.gpu.items()}
        host = max(self.host - before.host, self.heap - before.heap, 0)
        return Footprint(host, {d: b for d, b in gpu.items() if b})

    def plus(self, other: Footprint) -> Footprint:
        gpu = dict(self.gpu)
        for d, b in other.gpu.items():
            gpu[d] = gpu.get(d, 0) + b
        return Footprint(self.host + other.host, gpu)

    def memory_usage(self) -> list[dict[str, Any]]:
        """Triton's statistics ``memory_usage`` entries (``{type, id, byte_size}``)."""
        rows: list[dict[str, Any]] = [{"type": "CPU", "id": 0, "byte_size": self.host}]
        rows += [{"type": "GPU", "id": d, "byte_size": b} for d, b in sorted(self.gpu.items())]
        return rows


def host_rss(path: str = "/proc/self/statm") -> int:
    """Resident set size of this process in bytes (0 where /proc is not there)."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class GpuMemory:
    """This process's GPU memory per device through NVML (``observability.nvml``), when a GPU and NVML are there."""

    def read(self) -> dict[int, int]:
        lib = nvml.library()
        if lib is None:
            return {}
        out: dict[int, int] = {}
        pid = os.getpid()
        try:
            for i in range(lib.nvmlDeviceGetCount()):
                handle = lib.nvmlDeviceGetHandleByIndex(i)
                mine = [p.usedGpuMemory or 0 for p in lib.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid]
                out[i] = sum(mine) if mine else int(lib.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception as exc:  # a reading that fails is no reason to fail a load
            log.debug("NVML memory reading failed: %s", exc)
            return {}
        return out


_GPU = GpuMemory()


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def heap_in_use() -> int:
    """Bytes malloc has handed out in every arena plus its mmapped blocks (glibc ``mallinfo2``; 0 elsewhere)."""
    info = getattr(_LIBC, "mallinfo2", None)
    if info is None:
        return 0
    info.restype = _Mallinfo2
    m = info()
    return int(m.uordblks + m.hblkhd)


def measure() -> Footprint:
    """This process's host RSS (after handing freed pages back), malloc'd bytes and GPU memory now."""
    release_free_memory()
    return Footprint(host_rss(), _GPU.read(), heap_in_use())


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()


def release_free_memory() -> None:
    """Return freed heap pages to the system (glibc ``malloc_trim``; nothing elsewhere)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
