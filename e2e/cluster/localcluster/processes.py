"""The cluster's processes: started detached, told apart from a recycled PID by their /proc start time, stopped
(SIGTERM, then SIGKILL), and the free ports they listen on."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

from .base import log


def spawn(cmd: list[str], log_path: Path, cwd: Path, banner: str, env: dict | None = None) -> tuple[int, str | None]:
    """Start a component detached (its own session), appending to its log after a dated ``banner`` line.
    Returns its pid and /proc start time: the pair that tells it apart later from whatever reuses the pid."""
    with open(log_path, "ab") as logf:
        logf.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {banner}\n".encode())
        logf.flush()
        p = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=cwd,
            env=env,
        )
    st = None
    while st is None and p.poll() is None:
        st = proc_starttime(p.pid)
    return p.pid, st


def proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # zombie: already dead
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks since boot


def alive(comp: dict) -> bool:
    return proc_starttime(comp["pid"]) == comp["starttime"]


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


#: ports this process has handed out (the component or server may not have bound its port yet)
_HANDED_OUT: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` ports free on 127.0.0.1 now, chosen BELOW the kernel's ephemeral range, never handed out
    twice by this process (the test suite's servers take theirs here too: tests/support/server.py).

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, which every outgoing
    connection on the machine also draws from: between choosing it and the component binding it,
    a client's connection (or a test server's ``bind(0)``) can take it, and the component dies with
    "address already in use" (seen in CI: kube-scheduler, while other tests ran). Below the range
    only an explicit bind can collide, and ``up`` retries on that (see cmd_up); NodePorts are avoided too."""
    low = 10000
    high = max(low + 1000, min(30000, _ephemeral_range()[0]))  # 30000-32767: Services' NodePort range
    rng = random.Random()
    chosen: list[int] = []
    while len(chosen) < n:
        port = rng.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        _HANDED_OUT.add(port)
    return chosen


def stop(comp: dict, name: str) -> bool:
    """SIGTERM the recorded process ``comp``, SIGKILL it if it is still there after 20 s; wait until it is gone.
    Returns False when it was not running (any more)."""
    if not alive(comp):
        return False
    os.kill(comp["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 20
    while alive(comp) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(comp):
        log(f"{name} (pid {comp['pid']}) ignored SIGTERM; sending SIGKILL")
        os.kill(comp["pid"], signal.SIGKILL)
        while alive(comp):
            time.sleep(0.05)
    return True
