"""Host gauges read at scrape time: CPU utilization and memory from /proc, GPUs through NVML.

Nothing here runs on the request path. Where a source cannot be read (no /proc, no NVML library,
no GPU) the gauge is simply absent, as Triton does when GPU metrics are unavailable.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from . import nvml


def process_start_time() -> float | None:
    """When this process started, wall-clock seconds since the epoch (Linux /proc; None elsewhere), to the
    clock tick: now less the time since its start, which is the time since boot (CLOCK_BOOTTIME, the clock
    of /proc's start ticks) less its start in ticks since boot. Not /proc/stat's ``btime`` plus the ticks:
    ``btime`` is whole seconds, so that sum can be up to a second early."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22; the name may hold spaces
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no CLOCK_BOOTTIME (not Linux)
        return None


def cpu_memory(path: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(total, used) bytes of host RAM; used = MemTotal - MemAvailable, as Triton computes it."""
    try:
        with open(path) as f:
            info = {}
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "MemTotal" not in info or "MemAvailable" not in info:
        return None
    return info["MemTotal"], info["MemTotal"] - info["MemAvailable"]


class CpuUtilization:
    """Busy fraction of all host CPUs since the previous read (the first read covers time since boot)."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._last: tuple[int, int] = (0, 0)

    def _sample(self) -> tuple[int, int] | None:
        try:
            with open(self.path) as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    def read(self) -> float | None:
        sample = self._sample()
        if sample is None:
            return None
        total, idle = sample
        last_total, last_idle = self._last
        self._last = sample
        d_total = total - last_total
        if d_total <= 0:
            return 0.0
        return max(0.0, min(1.0, 1.0 - (idle - last_idle) / d_total))


@dataclass
class GpuSample:
    uuid: str
    utilization: float | None
    memory_total: int | None
    memory_used: int | None
    power_usage: float | None
    power_limit: float | None


class GpuReader:
    """The GPU gauges through NVML (``nvml``); none where NVML is not there."""

    def read(self) -> list[GpuSample]:
        lib = nvml.library()
        if lib is None:
            return []
        samples = []
        try:
            count = lib.nvmlDeviceGetCount()
        except Exception:
            return []
        for i in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(i)
                uuid = lib.nvmlDeviceGetUUID(handle)
            except Exception:
                continue
            samples.append(
                GpuSample(
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    utilization=nvml.optional(lambda h=handle: lib.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                    memory_total=nvml.optional(lambda h=handle: int(lib.nvmlDeviceGetMemoryInfo(h).total)),
                    memory_used=nvml.optional(lambda h=handle: int(lib.nvmlDeviceGetMemoryInfo(h).used)),
                    power_usage=nvml.optional(lambda h=handle: lib.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    power_limit=nvml.optional(lambda h=handle: lib.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
                )
            )
        return samples
