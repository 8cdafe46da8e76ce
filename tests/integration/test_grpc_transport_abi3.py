"""The Rust gRPC transport is built once against CPython's stable ABI (``kubeinfer_grpc_transport.abi3.so``, in a
``cp310-abi3`` wheel): a server on another CPython minor version (a CUDA base's python3 is 3.12) installs the
same wheel and serves with it.

The wheel is built by this interpreter (``pip wheel``, setup.py); the server runs from a fresh venv of the other
interpreter holding that wheel (``uv``, with the project's pins; seconds from a warm uv cache, a download of the
wheels for that version when cold); the client is tritonclient in this process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from kubeinfer.server.grpc.transport import rust_missing

from tests.support.repos import copy_example_repository
from tests.support.server import free_port, start_command

ROOT = Path(__file__).resolve().parents[2]
needs_rust = pytest.mark.skipif(rust_missing() is not None, reason=f"Rust transport: {rust_missing()}")


def find_cpython(version: str) -> str | None:
    """That interpreter on PATH or installed by pyenv (whose shims on PATH fail for a version not selected)."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [shutil.which(f"python{version}"), *sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)]
    for python in (str(p) for p in found if p):
        probe = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        if probe.returncode == 0 and probe.stdout.decode().strip() == version_tuple(version):
            return python
    return None


def version_tuple(version: str) -> str:
    return str(tuple(int(part) for part in version.split(".")))


def uv() -> str | None:
    local = Path(sys.executable).parent / "uv"  # scripts/test installs uv into the suite's venv
    return str(local) if local.exists() else shutil.which("uv")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("abi3-wheel")
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools packs what an older build left there
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    subprocess.run([*command, str(ROOT)], check=True, capture_output=True, timeout=900)
    (built,) = out.glob("kubeinfer-*-cp310-abi3-*.whl")
    return built


@needs_rust
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_one_built_module_serves_grpc_on_another_cpython(version: str, wheel: Path, tmp_path: Path) -> None:
    if version_tuple(version) == str(sys.version_info[:2]):
        pytest.skip(f"the suite itself runs on CPython {version}: the other gRPC tests cover it")
    python = find_cpython(version)
    if python is None:
        pytest.skip(f"no CPython {version} on PATH or in pyenv to load the abi3 module with")
    uv_command = uv()
    if uv_command is None:
        pytest.skip("no uv to make the other interpreter's venv (scripts/test installs it into .venv)")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubeinfer" / "uv"
    env = {"UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(cache)}
    venv = tmp_path / f"venv-{version}"
    subprocess.run([uv_command, "venv", "-q", str(venv), "--python", python], check=True, env={**os.environ, **env})
    venv_python = str(venv / "bin" / "python")
    install = [uv_command, "pip", "install", "-q", "--python", venv_python, "-c", str(ROOT / "constraints.txt")]
    subprocess.run([*install, str(wheel)], check=True, env={**os.environ, **env})

    which = "import kubeinfer.server.grpc.kubeinfer_grpc_transport as m, sys; print(sys.version_info[:2], m.__file__)"
    loaded = subprocess.run([venv_python, "-c", which], capture_output=True, text=True, cwd="/", env={"PYTHONPATH": ""})
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith(version_tuple(version) + " "), loaded.stdout
    assert loaded.stdout.strip().endswith("/site-packages/kubeinfer/server/grpc/kubeinfer_grpc_transport.abi3.so")

    repository = copy_example_repository(tmp_path / "repo")
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = [venv_python, "-m", "kubeinfer.server", "--grpc-transport", "rust", "--model-repository", str(repository)]
    command += ["--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc)]
    command += ["--metrics-port", str(metrics)]
    server = start_command(command, http, grpc, metrics, tmp_path / "server.log", env={"PYTHONPATH": ""})
    try:
        assert "(Rust transport)" in server.log(), server.log()[-4000:]
        client = grpcclient.InferenceServerClient(server.grpc_url)
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.full((1, 16), 2, dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        client.close()
    finally:
        server.terminate(30)
