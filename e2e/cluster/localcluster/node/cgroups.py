"""The kubelet's cgroup root (``/kubeinfer-<rid>`` in every hierarchy): made before it starts, removed after."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from ..node import log
from ..node.network import Net


def cgroup_mounts() -> list[Path]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            out.append(Path(fields[1]))
    return out


def make_cgroup_root(net: Net) -> None:
    for mnt in cgroup_mounts():
        d = mnt / net.cgroup_root.lstrip("/")
        d.mkdir(exist_ok=True)
        if (mnt / "cpuset.cpus").exists():  # cgroup v1 cpuset: a child starts empty
            for f in ("cpuset.cpus", "cpuset.mems"):
                with contextlib.suppress(OSError):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((mnt / f).read_text())


def remove_cgroup_root(net: Net) -> list[int]:
    """Kill whatever still runs under the cgroup root and remove it, leaves first. Returns killed PIDs."""
    killed: list[int] = []
    for mnt in cgroup_mounts():
        root = mnt / net.cgroup_root.lstrip("/")
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                for pid in map(int, procs.read_text().split()):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
    deadline = time.monotonic() + 10
    for mnt in cgroup_mounts():
        root = mnt / net.cgroup_root.lstrip("/")
        if not root.is_dir():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, root]:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log(f"could not remove cgroup {d} (processes still inside?)")
                        break
                    time.sleep(0.1)
    return killed
