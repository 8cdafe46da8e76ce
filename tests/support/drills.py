"""One summary line per fuzzing run or fault drill, printed at the end of the pytest output.

Tests call ``report(name, ...)``; ``tests/conftest.py`` prints the lines in a "drills" section of the
terminal summary (so they show whatever the capture settings) and writes them to
``$KUBEINFER_DRILL_REPORT`` when that is set.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

LINES: list[str] = []


def report(
    name: str, *, inputs: int, crashes: int = 0, server_errors: int = 0, failed_good: int = 0, rss: str = "n/a"
) -> str:
    line = (
        f"{name}: inputs tried {inputs}, crashes {crashes}, 5xx-on-bad-input {server_errors}, "
        f"failed good requests {failed_good}, RSS growth {rss}"
    )
    return note(line)


def note(line: str) -> str:
    """A line of a drill's figures for the summary (shown whatever the capture settings, also for a pass)."""
    LINES.append(line)
    target = os.environ.get("KUBEINFER_DRILL_REPORT")
    if target:
        with Path(target).open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    return line


def write_summary(terminalreporter: Any) -> None:
    """The "drills" section of the terminal summary (both conftests' ``pytest_terminal_summary``)."""
    if LINES:
        terminalreporter.section("drills")
        for line in LINES:
            terminalreporter.write_line(line)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def sample_rss(pid: int, out: list[int], stop: threading.Event, interval: float = 0.5) -> None:
    """Append the process's resident set size (bytes, /proc) to ``out`` every ``interval`` seconds until ``stop``
    is set or the process is gone; run it in a thread beside a drill."""
    while not stop.wait(interval):
        try:
            out.append(rss_bytes(pid))
        except (OSError, RuntimeError):
            return


def mib(n: float) -> str:
    return f"{n / (1 << 20):+.1f} MiB"
