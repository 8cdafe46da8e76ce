"""The ``go`` tool as the builds call it: pinned modules only (``-mod=readonly``), no cgo, local toolchain."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from .base import CLUSTER_DIR, ClusterError, log

#: the compiler writes no DWARF: every binary is linked with ``-s -w``, which drops it anyway (stack traces
#: come from the symbol table Go keeps), so the binaries work the same and a cold build costs less CPU
#: (Prometheus's: 177 -> 150 s of CPU). Not part of the build recipes' cache keys for that reason.
NO_DWARF = "-gcflags=all=-dwarf=false"


def go_env() -> dict:
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN=os.environ.get("KUBEINFER_GOTOOLCHAIN", "local"),
        GOWORK="off",
        CGO_ENABLED="0",
        GOFLAGS=f"-modcacherw -mod=readonly -buildvcs=false {NO_DWARF}",
    )
    return env


def go(args: list[str], mod: str, capture: bool = False) -> str:
    cmd = ["go", *args]
    log(f"({mod}) $ {' '.join(shlex.quote(a) for a in cmd)}")
    try:
        p = subprocess.run(
            cmd,
            cwd=CLUSTER_DIR / mod,
            env=go_env(),
            stdout=subprocess.PIPE if capture else sys.stderr,
            stderr=sys.stderr,
            text=True,
        )
    except FileNotFoundError as e:
        raise ClusterError("`go` not found on PATH: it is needed to build the binaries") from e
    if p.returncode != 0:
        raise ClusterError(
            f"go {' '.join(args[:2])} failed in e2e/cluster/{mod} (exit {p.returncode}); see the output above"
        )
    return p.stdout if capture else ""


def module_info(mod: str, path: str) -> dict:
    """Version, commit and time of a pinned dependency, from the module cache."""
    d = json.loads(go(["mod", "download", "-json", path], mod, capture=True))
    if d.get("Error"):
        raise ClusterError(f"go mod download {path}: {d['Error']}")
    info = json.loads(Path(d["Info"]).read_text())
    return {
        "version": d["Version"],
        "dir": d["Dir"],
        "time": info.get("Time", "1970-01-01T00:00:00Z").replace(".000Z", "Z"),
        "commit": (info.get("Origin") or {}).get("Hash", ""),
    }
