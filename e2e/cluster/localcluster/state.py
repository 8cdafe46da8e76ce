"""The run folder's record of a cluster (``state.json``) and of the processes that hold it (``up --hold``)."""

from __future__ import annotations

import json
from pathlib import Path

from .base import ClusterError
from .processes import proc_starttime


def load_state(rd: Path) -> dict | None:
    try:
        return json.loads((rd / "state.json").read_text())
    except (OSError, ValueError):
        return None


def save_state(rd: Path, state: dict) -> None:
    tmp = rd / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.rename(rd / "state.json")


def live_holders(rd: Path) -> list[int]:
    """PIDs registered with ``up --hold`` that are still alive (stale files are removed)."""
    live = []
    for f in (rd / "holders").glob("*"):
        try:
            pid, st = int(f.name), f.read_text().strip()
        except (OSError, ValueError):
            continue
        if proc_starttime(pid) == st:
            live.append(pid)
        else:
            f.unlink(missing_ok=True)
    return sorted(live)


def add_holder(rd: Path, pid: int) -> None:
    st = proc_starttime(pid)
    if st is None:
        raise ClusterError(f"--hold {pid}: no such process")
    (rd / "holders").mkdir(exist_ok=True)
    (rd / "holders" / str(pid)).write_text(st + "\n")
