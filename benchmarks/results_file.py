"""What every benchmark's results file starts with, and where it is written.

The machine is shared and noisy, so each file records when it ran, on what, and the load average before
and after: a reader can tell a quiet run from a contended one without the person who ran it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def header() -> dict[str, Any]:
    """The fields a report starts with; ``write`` adds ``load_average_end``."""
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(),
    }


def write(report: dict[str, Any], name: str, out: Path | None = None, indent: int = 1) -> Path:
    """``report`` (with the end load average) as JSON at ``out``, or ``results/<name>-<time>.json``."""
    report["load_average_end"] = os.getloadavg()
    path = out or RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent))
    return path
