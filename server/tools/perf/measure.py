"""One load level measured as perf_analyzer does: warm-up, then windows until the last three are stable.

Stable: in each of the last ``STABLE_WINDOWS`` windows, throughput and the ``--percentile`` latency are
within ``--stability-percentage`` of their average over those windows. The level's figures are those
windows together; after ``--max-trials`` windows without stability, the last three are reported and
the level is marked unstable. Statistics are read at every window boundary, so the server-side split
covers the same windows (give or take the requests in flight at the two boundaries).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from .load import Level, Sample, WorkerPool
from .server import CpuProbe, ServerApi, server_split

STABLE_WINDOWS = 3


@dataclass
class Plan:
    model: str
    version: str
    batch_size: int
    window_s: float
    warmup_s: float
    stability: float  # percent
    max_trials: int
    percentile: int


@dataclass
class Window:
    sample: Sample
    stats: dict[str, int] | None  # statistics at the window's end
    server_cpu_s: float | None  # server CPU seconds at the window's end
    coordinator_cpu_s: float

    @property
    def throughput(self) -> float:
        return len(self.sample.latencies) / self.sample.wall_s if self.sample.wall_s else 0.0

    def latency(self, percentile: int) -> float:
        lat = self.sample.latencies
        return float(np.percentile(lat, percentile)) if len(lat) else float("inf")


def is_stable(windows: list[Window], percentile: int, stability: float) -> bool:
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    tolerance = stability / 100
    for values in ([w.throughput for w in last], [w.latency(percentile) for w in last]):
        mean = sum(values) / len(values)
        if not np.isfinite(mean) or mean <= 0:
            return False
        if any(abs(v - mean) > tolerance * mean for v in values):
            return False
    return True


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def measure_level(
    pool: WorkerPool,
    api: ServerApi,
    plan: Plan,
    level: Level,
    cpu: CpuProbe | None,
    progress: TextIO | None = sys.stderr,
    on_window: Callable[[int, Window], None] | None = None,
) -> dict[str, Any]:
    """Run one level and return its figures (see ``report`` for the fields)."""
    n = len(pool)
    shares = [
        Level(
            concurrency=level.concurrency // n + (1 if i < level.concurrency % n else 0),
            rate=level.rate / n,
            distribution=level.distribution,
            max_inflight=max(1, level.max_inflight // n),
        )
        for i in range(n)
    ]
    label = f"concurrency {level.concurrency}" if level.concurrency else f"request rate {level.rate:g}/s"
    totals = Sample(latencies=np.empty(0))
    everything: list[Sample] = []

    def snapshot() -> Window:
        pool.send("sample")  # the workers cut their window while the statistics are read
        stats = api.statistics(plan.model, plan.version)
        samples = pool.receive()
        merged = Sample.merge(samples)
        everything.append(merged)
        return Window(merged, stats, cpu.read() if cpu else None, time.process_time())

    pool.call("start", shares)
    time.sleep(plan.warmup_s)
    start = snapshot()  # the warm-up's requests count in the totals, not in the figures
    windows: list[Window] = []
    stable = False
    while len(windows) < max(plan.max_trials, 1):
        time.sleep(plan.window_s)
        window = snapshot()
        windows.append(window)
        stable = is_stable(windows, plan.percentile, plan.stability)
        if progress is not None:
            print(
                f"  {label}: pass [{len(windows)}] throughput {window.throughput * plan.batch_size:.1f} infer/s, "
                f"p{plan.percentile} {_ms(window.latency(plan.percentile))} ms"
                + (f", {window.sample.errors} errors" if window.sample.errors else "")
                + (" (stable)" if stable else ""),
                file=progress,
                flush=True,
            )
        if on_window is not None:
            on_window(len(windows), window)
        if stable:
            break
    leftover = Sample.merge(pool.call("stop"))
    everything.append(leftover)
    totals = Sample.merge(everything)

    used = windows[-STABLE_WINDOWS:]
    before = windows[-STABLE_WINDOWS - 1] if len(windows) > STABLE_WINDOWS else start
    sample = Sample.merge([w.sample for w in used])
    wall = sum(w.sample.wall_s for w in used)
    lat = sample.latencies
    requests = len(lat)

    def pct(p: float) -> float | None:
        return _ms(float(np.percentile(lat, p))) if requests else None

    result: dict[str, Any] = {
        "concurrency": level.concurrency or None,
        "request_rate": level.rate or None,
        "batch_size": plan.batch_size,
        "throughput": round(requests * plan.batch_size / wall, 2) if wall else 0.0,
        "requests_per_second": round(requests / wall, 2) if wall else 0.0,
        "requests": requests,
        "errors": sample.errors,
        "error_messages": dict(sample.messages.most_common(5)),
        "avg_ms": _ms(float(lat.mean())) if requests else None,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
        "max_ms": _ms(float(lat.max())) if requests else None,
        "stable": stable,
        "windows": len(windows),
        "window_seconds": round(wall / max(len(used), 1), 3),
        "delayed": sample.delayed,
        # every request of the level, warm-up and discarded windows included (what the server counted)
        "total_requests": len(totals.latencies),
        "total_errors": totals.errors,
        "server": server_split(before.stats, used[-1].stats),
        "client_cpu": _cpu(sample.cpu_s + used[-1].coordinator_cpu_s - before.coordinator_cpu_s, wall, requests),
        "server_cpu": (
            _cpu(used[-1].server_cpu_s - before.server_cpu_s, wall, requests)
            if used[-1].server_cpu_s is not None and before.server_cpu_s is not None
            else None
        ),
    }
    if totals.errors and not result["error_messages"]:
        result["error_messages"] = dict(totals.messages.most_common(5))
    return result


def _cpu(seconds: float, wall: float, requests: int) -> dict[str, Any]:
    return {
        "percent_of_core": round(100 * seconds / wall, 1) if wall else None,
        "us_per_request": round(seconds / requests * 1e6, 1) if requests else None,
    }
