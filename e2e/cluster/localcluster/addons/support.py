"""What the add-ons share: their cached build folders, PyYAML, and host processes (run, launch, wait, kubectl)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import base, processes, scaffold
from ..base import ClusterError, log
from ..processes import alive, tail
from ..state import save_state


def pyyaml() -> Any:
    """PyYAML: KEDA's and the Prometheus Operator's manifests are YAML (the project's .venv has it)."""
    try:
        import yaml
    except ImportError as e:
        raise ClusterError(
            "the add-ons read YAML manifests: run with a Python that has PyYAML (.venv/bin/python)"
        ) from e
    return yaml


def addons_dir() -> Path:
    return base.cache_dir() / "addons"


def key(*parts: bytes) -> str:
    """The cache key of an add-on: a hash of its recipe string and input files' bytes."""
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()[:16]


def module_files(*rel: str) -> list[bytes]:
    return [(base.CLUSTER_DIR / r).read_bytes() for r in rel]


def cached(name: str, key: str, make: Callable[[Path], None]) -> Path:
    """``<cache>/addons/<name>-<key>``, made by ``make(tmpdir)`` once (``scaffold.build_once``: atomic, locked)."""
    target = addons_dir() / f"{name}-{key}"
    t0 = time.monotonic()

    def build(tmp: Path) -> None:
        log(f"building add-on {name} into {target}")
        make(tmp)

    if scaffold.build_once(target, addons_dir() / f".{name}.lock", build):
        log(f"add-on {name} built in {time.monotonic() - t0:.0f}s")
    return target


def run(cmd: list[str], what: str, cwd: str | None = None, input: str | None = None, env: dict | None = None) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, input=input, env=env)
    except FileNotFoundError as e:
        raise ClusterError(f"{what}: {cmd[0]} not found") from e
    if p.returncode != 0:
        raise ClusterError(
            f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"
        )
    return p.stdout


def launch(rd: Path, state: dict, name: str, cmd: list[str], env: dict | None = None) -> dict:
    pid, st = processes.spawn(cmd, rd / "logs" / f"{name}.log", rd, f"starting {name}", env)
    comp = {"pid": pid, "starttime": st, "log": str(rd / "logs" / f"{name}.log"), "cmd": cmd}
    state.setdefault("addons", {})[name] = comp
    (rd / "pids" / f"{name}.pid").write_text(f"{pid}\n")
    save_state(rd, state)
    return comp


def wait(what: str, check, comps: list[dict], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for comp in comps:
            if not alive(comp):
                raise ClusterError(f"{comp['cmd'][0]} exited while waiting for {what}:\n{tail(Path(comp['log']))}")
        try:
            if check():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {x['log']}\n{tail(Path(x['log']), 25)}" for x in comps)
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(0.5)


def kubectl(state: dict, *args: str, input: str | None = None, kubeconfig: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": kubeconfig or state["kubeconfig"]}
    return run([str(Path(state["bin_dir"]) / "kubectl"), *args], what=f"kubectl {args[0]}", input=input, env=env)
