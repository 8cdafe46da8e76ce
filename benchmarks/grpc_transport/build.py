"""Build the Rust extension module (cargo, release) into ``build/`` and make it importable.

Plain cargo, no maturin: the crate is a ``cdylib`` linked against the running interpreter (``PYO3_PYTHON``),
and the shared library is copied to ``build/kubeinfer_grpc_transport.so``. Rebuilt when a source file is
newer than the copy. ~1 min on 2 cores the first time (crates.io must be reachable), seconds after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRATE = HERE / "rust"
BUILD = HERE / "build"
MODULE = BUILD / "kubeinfer_grpc_transport.so"


def _newest_source() -> float:
    files = [CRATE / "Cargo.toml", CRATE / "Cargo.lock", *(CRATE / "src").rglob("*.rs")]
    return max(f.stat().st_mtime for f in files if f.exists())


def build(force: bool = False) -> Path:
    if not force and MODULE.exists() and MODULE.stat().st_mtime >= _newest_source():
        return MODULE
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    env = {**os.environ, "PYO3_PYTHON": sys.executable, "CARGO_TARGET_DIR": str(BUILD / "target")}
    print("building the Rust gRPC transport (cargo build --release) ...", flush=True)
    subprocess.run([cargo, "build", "--release", "--locked"], cwd=CRATE, env=env, check=True)
    BUILD.mkdir(exist_ok=True)
    built = BUILD / "target" / "release" / "libkubeinfer_grpc_transport.so"
    tmp = MODULE.with_suffix(".tmp")
    shutil.copy(built, tmp)
    tmp.replace(MODULE)
    return MODULE


def importable() -> None:
    """Build if needed and put ``build/`` on sys.path."""
    build()
    if str(BUILD) not in sys.path:
        sys.path.insert(0, str(BUILD))


if __name__ == "__main__":
    print(build(force="--force" in sys.argv))
