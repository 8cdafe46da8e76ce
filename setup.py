"""Maps the top-level folders into the ``kubeinfer`` namespace and builds the Rust gRPC transport.

``server/`` becomes ``kubeinfer.server`` and ``operator/`` becomes ``kubeinfer.operator``; a plain
``operator`` package would shadow Python's standard library, so neither folder is importable on its own.

The server's gRPC transport (the crate in ``server/grpc/rust``) is compiled by setuptools-rust into
``kubeinfer/server/grpc/kubeinfer_grpc_transport.abi3.so`` whenever this package is built: ``pip install .``,
``pip install -e .`` (the library lands beside the sources), ``pip wheel .`` and ``python -m build``. It is
built against CPython's stable ABI from 3.10 up, so the wheel is tagged ``cp310-abi3-<platform>``. Where it
cannot be built (no ``cargo`` on PATH, or not Linux: the transport waits on a Linux eventfd) the package is
built without it, saying so once, and the server serves gRPC with grpc.aio (it logs why at start);
``KUBEINFER_REQUIRE_GRPC_TRANSPORT=1`` (CI) makes that, and a failed cargo build, an error. Everything else
lives in pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from setuptools import find_packages, setup

FOLDERS = {"kubeinfer.server": "server", "kubeinfer.operator": "operator"}
CRATE = "server/grpc/rust/Cargo.toml"
PATCHES = "server/grpc/rust/patches/apply.py"
MODULE = "kubeinfer.server.grpc.kubeinfer_grpc_transport"
REQUIRE = "KUBEINFER_REQUIRE_GRPC_TRANSPORT"
#: the commands that compile extensions (the others, e.g. egg_info, dist_info, sdist, only describe the package)
BUILDS = {"build", "build_ext", "build_rust", "bdist_wheel", "editable_wheel", "install", "develop"}

packages = []
package_dir = {}
for name, folder in FOLDERS.items():
    packages.append(name)
    package_dir[name] = folder
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]


def find_cargo() -> str | None:
    """cargo on PATH, else rustup's (a shell that has not read rustup's profile lines yet)."""
    found = shutil.which(os.environ.get("CARGO", "cargo"))
    if found is None:
        rustup = os.path.join(os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo"), "bin", "cargo")
        found = rustup if os.access(rustup, os.X_OK) else None
    return found


def why_not_built(cargo: str | None) -> str | None:
    """Why the Rust transport cannot be built here (None: it can)."""
    if not sys.platform.startswith("linux"):
        return f"it is built on Linux only (this is {sys.platform})"
    if cargo is None:
        return "cargo is not on PATH (install Rust from https://rustup.rs, then reinstall kubeinfer)"
    return None


def rust_options() -> dict[str, Any]:
    """setup() arguments for the extension, or none (with one notice) when it cannot be built."""
    required = os.environ.get(REQUIRE) == "1"
    cargo = find_cargo()
    why = why_not_built(cargo)
    if why is not None:
        if not BUILDS & set(sys.argv[1:]):
            return {}
        if required:
            raise SystemExit(f"kubeinfer: the Rust gRPC transport cannot be built: {why}; {REQUIRE}=1 requires it")
        print(
            f"kubeinfer: building without the Rust gRPC transport: {why}. "
            "The server serves gRPC with grpc.aio instead (about 2.7x the CPU per call).",
            file=sys.stderr,
        )
        return {}
    from setuptools_rust import Binding, RustExtension

    # setuptools-rust runs $CARGO; rustup's rustc sits beside cargo
    os.environ["CARGO"] = str(cargo)
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(str(cargo)), os.environ.get("PATH", "")])
    if BUILDS & set(sys.argv[1:]):
        # the patched crates Cargo.toml's [patch.crates-io] points at (server/grpc/rust/patches/README.md)
        patched = subprocess.run([sys.executable, PATCHES], capture_output=True, text=True)
        if patched.returncode != 0:
            why = patched.stderr.strip() or patched.stdout.strip()
            if required:
                raise SystemExit(f"kubeinfer: the Rust gRPC transport cannot be built: {why}")
            print(f"kubeinfer: building without the Rust gRPC transport: {why}", file=sys.stderr)
            return {}

    extension = RustExtension(
        MODULE,
        path=CRATE,
        binding=Binding.PyO3,
        py_limited_api=True,
        # release also for `pip install -e .` (setuptools-rust's default there is a debug build)
        debug=False,
        cargo_manifest_args=["--locked"],
        # without cargo's registry (offline, an old rustc) the package still installs, on grpc.aio
        optional=not required,
        # pyo3 is built against the base interpreter, whose path stays the same across build environments
        # and venvs (pip's and uv's isolated builds each run in a new one): a new path would rebuild pyo3
        env={**os.environ, "PYO3_PYTHON": os.path.realpath(getattr(sys, "_base_executable", sys.executable))},
    )
    return {"rust_extensions": [extension], "options": {"bdist_wheel": {"py_limited_api": "cp310"}}}


setup(packages=packages, package_dir=package_dir, **rust_options())
