"""Talking to the node's containerd: readiness, the pause image, and stopping every pod container."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ..node import NodeError
from ..node.pause_image import pause_image


def ctr(p: dict, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    cmd = ["ctr", "--address", p["containerd_socket"], "--namespace", "k8s.io", *args]
    proc = subprocess.run(cmd, capture_output=True, input=input)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
    return proc


def containerd_ready(p: dict) -> bool:
    return Path(p["containerd_socket"]).exists() and ctr(p, "version", check=False).returncode == 0


#: what containerd's CRI service logs once it has recovered its state, right before it marks itself initialized
#: (containerd 2.x, internal/cri/server/service.go ``Run``). ``ctr version`` answers earlier: a kubelet started
#: in between fails "validate CRI v1 runtime API ... server is not initialized yet" and exits (seen once, when
#: recovering took 2 s instead of 20 ms).
CRI_SERVING = b'msg="Start streaming server"'

#: the kubelet's words when it reached the CRI service too early (it exits; starting it again is the cure)
CRI_NOT_INITIALIZED = "server is not initialized yet"


def cri_serving(log_path: Path, offset: int) -> bool:
    """containerd's CRI service logged that it serves, after byte ``offset`` of its log (this start)."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        return CRI_SERVING in f.read()


def ensure_pause_image(p: dict, bins: Path) -> str:
    ref, archive = pause_image(bins)
    if ref not in ctr(p, "images", "ls", "-q").stdout.decode().split():
        ctr(p, "images", "import", "-", input=archive)
    return ref


def kill_pods(p: dict) -> int:
    """Stop every container the node's containerd runs (called after the kubelet is gone)."""
    if not containerd_ready(p):
        return 0
    ids = ctr(p, "containers", "ls", "-q", check=False).stdout.decode().split()
    Path(p["node_dir"], "containers-at-stop").write_text("\n".join(ids) + "\n")
    tasks = ctr(p, "tasks", "ls", "-q", check=False).stdout.decode().split()
    for t in tasks:
        ctr(p, "tasks", "kill", "-s", "SIGKILL", t, check=False)
    deadline = time.monotonic() + 15
    for t in tasks:
        while ctr(p, "tasks", "delete", t, check=False).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    for c in ctr(p, "containers", "ls", "-q", check=False).stdout.decode().split():
        ctr(p, "containers", "delete", c, check=False)
    return len(tasks)
