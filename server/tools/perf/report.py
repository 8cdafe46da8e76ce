"""The results: a terminal table, ``--json``, ``-f`` CSV and ``--plot`` PNG.

JSON: ``{"model", "version", "protocol", "url", "batch_size", "settings", "levels": [...]}``; each level has
``concurrency`` or ``request_rate``, ``throughput`` (inferences/s = requests/s × batch size),
``requests_per_second``, ``requests`` (successful requests in the measured windows), ``errors``,
``error_messages``, ``avg_ms``/``p50_ms``/``p90_ms``/``p95_ms``/``p99_ms``/``max_ms``, ``stable``,
``windows``, ``window_seconds``, ``delayed`` (open loop: sends later than scheduled), ``total_requests``/
``total_errors`` (the whole level, warm-up included), ``server`` (the statistics API's split over the
measured windows: ``queue_us``, ``compute_input_us``, ``compute_infer_us``, ``compute_output_us``,
``success``, ``fail``, ``executions``, ``avg_batch``; null without a statistics API), ``client_cpu`` and
``server_cpu`` (``percent_of_core``, ``us_per_request``; server only with ``--server-pid``).

CSV: perf_analyzer's column names where they mean the same (latencies in microseconds), one row a level.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

CSV_COLUMNS = [
    "Concurrency",
    "Request Rate",
    "Inferences/Second",
    "Requests",
    "Errors",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Avg latency",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Client CPU %",
    "Server CPU us/request",
    "Stable",
]


def _us(ms: float | None) -> int | str:
    return "" if ms is None else round(ms * 1000)


def csv_rows(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for lv in levels:
        server = lv.get("server") or {}
        rows.append(
            {
                "Concurrency": lv["concurrency"] or "",
                "Request Rate": lv["request_rate"] or "",
                "Inferences/Second": lv["throughput"],
                "Requests": lv["requests"],
                "Errors": lv["errors"],
                "Server Queue": _round(server.get("queue_us")),
                "Server Compute Input": _round(server.get("compute_input_us")),
                "Server Compute Infer": _round(server.get("compute_infer_us")),
                "Server Compute Output": _round(server.get("compute_output_us")),
                "Avg latency": _us(lv["avg_ms"]),
                "p50 latency": _us(lv["p50_ms"]),
                "p90 latency": _us(lv["p90_ms"]),
                "p95 latency": _us(lv["p95_ms"]),
                "p99 latency": _us(lv["p99_ms"]),
                "Client CPU %": (lv.get("client_cpu") or {}).get("percent_of_core", ""),
                "Server CPU us/request": (lv.get("server_cpu") or {}).get("us_per_request", ""),
                "Stable": "yes" if lv["stable"] else "no",
            }
        )
    return rows


def _round(value: float | None) -> int | str:
    return "" if value is None else round(value)


def write_csv(path: Path, levels: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(levels))


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=1) + "\n")


def table(levels: list[dict[str, Any]], percentile: int) -> str:
    head = [
        "load",
        "infer/s",
        "requests",
        "errors",
        "p50 ms",
        "p90 ms",
        "p95 ms",
        "p99 ms",
        "queue us",
        "infer us",
        "batch",
        "client cpu",
        "server us/req",
        "stable",
    ]
    rows = [head]
    for lv in levels:
        server = lv.get("server") or {}
        load = f"c={lv['concurrency']}" if lv["concurrency"] else f"{lv['request_rate']:g}/s"
        rows.append(
            [
                load,
                f"{lv['throughput']:.1f}",
                str(lv["requests"]),
                str(lv["errors"]),
                *(_fmt(lv[k]) for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms")),
                _fmt(server.get("queue_us")),
                _fmt(server.get("compute_infer_us")),
                _fmt(server.get("avg_batch")),
                f"{(lv.get('client_cpu') or {}).get('percent_of_core', 0):.0f}%",
                _fmt((lv.get("server_cpu") or {}).get("us_per_request")),
                "yes" if lv["stable"] else "NO",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    notes = []
    for lv in levels:
        for message, count in (lv.get("error_messages") or {}).items():
            notes.append(f"  {count} × {message}")
    if any(not lv["stable"] for lv in levels):
        notes.append(
            f"  unstable: throughput or p{percentile} latency varied more than the stability percentage over the "
            "last 3 windows (a busy machine?); raise --max-trials or --measurement-interval"
        )
    late = sum(lv.get("delayed") or 0 for lv in levels)
    if late:
        notes.append(
            f"  {late} sends started more than 1 ms after their scheduled time (more than --max-threads in flight, "
            "or the load generator fell behind): the request rate was not met"
        )
    cpu = [(lv.get("client_cpu") or {}).get("percent_of_core") or 0 for lv in levels]
    if any(c >= 90 for c in cpu):
        notes.append("  the load generator used most of a core: its own CPU may limit these numbers (--processes)")
    return "\n".join(lines + notes)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:.0f}"
    return str(value)


def plot(path: Path, runs: dict[str, list[dict[str, Any]]], title: str) -> None:
    """Latency (p50 solid, p99 dashed) against throughput, one colour per run."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'kubeinfer[perf]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for i, (label, levels) in enumerate(runs.items()):
        points = [lv for lv in levels if lv["p50_ms"] is not None]
        x = [lv["throughput"] for lv in points]
        color = f"C{i}"
        ax.plot(x, [lv["p50_ms"] for lv in points], "o-", color=color, label=f"{label} p50")
        ax.plot(x, [lv["p99_ms"] for lv in points], "s--", color=color, label=f"{label} p99")
        for lv in points:
            load = f"c{lv['concurrency']}" if lv["concurrency"] else f"{lv['request_rate']:g}/s"
            ax.annotate(load, (lv["throughput"], lv["p50_ms"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
