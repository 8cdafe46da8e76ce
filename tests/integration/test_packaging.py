"""The package as users get it: the wheel (not only the editable source tree) imports, carries its data files and
the Rust gRPC transport, and serves; a source install builds the transport with cargo, or says it cannot and
serves gRPC with grpc.aio; the sdist carries the crate.

Each server here runs from a venv of its own that holds only the built package and its requirements (uv, with
the project's pins: seconds from a warm uv cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.https import make_ca_and_cert
from tests.support.repos import copy_example_repository
from tests.support.server import ServerProcess, free_port, start_command

ROOT = Path(__file__).resolve().parents[2]
TRANSPORT = "kubeinfer/server/grpc/kubeinfer_grpc_transport.abi3.so"
RUST_LISTENING = "gRPC listening on"
CARGO = shutil.which("cargo") or (
    str(Path.home() / ".cargo" / "bin" / "cargo") if (Path.home() / ".cargo" / "bin" / "cargo").exists() else None
)
needs_cargo = pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the wheel has no Rust transport")


def _pip_wheel(out: Path, env: dict[str, str] | None = None) -> tuple[Path, str]:
    """``pip wheel`` of the source tree (the dev extra's setuptools-rust, no build isolation): (wheel, pip's log).
    pip builds in the source tree, and setuptools packs whatever its build/ folder holds: files an older build
    configuration left there would be packed too, so the folder (git-ignored scratch) is emptied first."""
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = out.glob("kubeinfer-*.whl")  # one wheel
    return wheel, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built, _ = _pip_wheel(tmp_path_factory.mktemp("wheel"))
    return built


@pytest.fixture(scope="module")
def wheel_dir(wheel: Path) -> Path:
    unpacked = wheel.parent / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(unpacked)
    # the namespace is kubeinfer.*: no top-level 'operator' (would shadow the stdlib) or 'server'
    assert not any(n.startswith(("operator/", "server/")) for n in names)
    for required in (
        "kubeinfer/server/config/model_config.proto",
        "kubeinfer/server/config/model_config_pb2.py",
        "kubeinfer/server/examples/model_repository/cifar10_resnet/config.pbtxt",
        "kubeinfer/server/examples/model_repository/add_sub/config.pbtxt",
    ):
        assert required in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "kubeinfer-server = kubeinfer.server.cli:main" in text
    assert "[kubeinfer.backends]" in text
    return unpacked


def _uv() -> str:
    local = Path(sys.executable).parent / "uv"  # scripts/test installs uv into the suite's venv
    found = str(local) if local.exists() else shutil.which("uv")
    if found is None:
        pytest.skip("no uv to make a venv with (scripts/test installs it into .venv)")
    return found


def _venv(folder: Path, *install: str, env: dict[str, str] | None = None) -> Path:
    """A new venv holding ``install`` (a wheel, or a source folder uv builds) and its requirements; its python."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubeinfer" / "uv"
    env = {**os.environ, "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(cache), **(env or {})}
    uv = _uv()
    subprocess.run([uv, "venv", "-q", str(folder), "--python", sys.executable], check=True, env=env)
    python = folder / "bin" / "python"
    constraints = ["-c", str(ROOT / "constraints.txt")]
    done = subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(python), *constraints, *install],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return python


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return copy_example_repository(tmp_path / "repo")


def _serve(python: Path, repository: Path, folder: Path, *flags: str) -> ServerProcess:
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = [str(python), "-m", "kubeinfer.server", "--model-repository", str(repository), "--host", "127.0.0.1"]
    command += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), *flags]
    # from a folder outside the source tree, so that nothing there is imported instead of the venv's copy
    return start_command(command, http, grpc, metrics, folder / f"server-{http}.log", env={"PYTHONPATH": ""})


def _add_sub(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _served_by(python: Path, module: str = "kubeinfer.server.grpc.kubeinfer_grpc_transport") -> str:
    code = f"import {module} as m; print(m.__file__)"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", env={"PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# ------------------------------------------------------------------------------------------ the wheel


def _env(site: Path) -> dict[str, str]:
    # PYTHONPATH comes before the editable finder on sys.meta_path, so the wheel's copy is imported
    return {**os.environ, "PYTHONPATH": str(site)}


def test_wheel_imports_from_its_own_files(wheel_dir: Path) -> None:
    code = (
        "import kubeinfer.server, kubeinfer.server.config as c, operator;"
        "print(kubeinfer.server.__file__); print(operator.__file__ or 'builtin');"
        "print(c.parse_config_text('max_batch_size: 2').max_batch_size)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(wheel_dir),
        capture_output=True,
        text=True,
        check=True,
        cwd=wheel_dir.parent,
    )
    server_file, operator_file, mbs = out.stdout.split()
    assert server_file.startswith(str(wheel_dir))
    assert "kubeinfer" not in operator_file  # the standard library's operator module
    assert mbs == "2"


def test_wheel_serves_the_example_repository(wheel_dir: Path, tmp_path: Path) -> None:
    http_port = free_port()
    env = {**_env(wheel_dir), "KUBEINFER_CACHE": str(tmp_path / "cache")}
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubeinfer.server",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--allow-grpc",
            "false",
            "--allow-metrics",
            "false",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        ServerProcess(proc, http_port, 0, 0, tmp_path / "server.log").wait_ready()
        client = httpclient.InferenceServerClient(url=f"127.0.0.1:{http_port}")
        x = np.zeros((1, 3, 32, 32), np.float32)
        inp = httpclient.InferInput("input", x.shape, "FP32")
        inp.set_data_from_numpy(x)
        assert client.infer("cifar10_resnet", [inp]).as_numpy("output").shape == (1, 10)
        (repo,) = (tmp_path / "cache").glob("example-repository-0.1.0-*")
        assert (repo / "cifar10_resnet" / "1" / "model.onnx").exists()
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


@needs_cargo
def test_the_wheel_is_one_platform_wheel_for_the_stable_abi_holding_the_transport(wheel: Path) -> None:
    """Tagged for CPython's stable ABI from 3.10 (one file for 3.10-3.14) and this platform: pip and setuptools
    tag a locally built wheel linux_x86_64; a manylinux tag is auditwheel's to give (docs/development.md)."""
    assert wheel.name.startswith("kubeinfer-0.1.0-cp310-abi3-linux_"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert TRANSPORT in names
    assert [n for n in names if n.endswith(".so")] == [TRANSPORT]
    assert not any("/rust/" in n for n in names), "the crate's sources belong in the sdist, not the wheel"


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with only the wheel (and its requirements) installed."""
    return _venv(tmp_path_factory.mktemp("wheel-venv") / "venv", str(wheel))


@needs_cargo
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_venv_with_only_the_wheel_serves_grpc_through_the_rust_transport(
    wheel_venv: Path, repository: Path, tmp_path: Path, tls: bool
) -> None:
    """tritonclient over HTTP and gRPC, gRPC plain and over TLS (Triton's --grpc-use-ssl flags)."""
    assert _served_by(wheel_venv).startswith(str(wheel_venv.parent.parent)), "imported from outside the venv"
    flags = ["--grpc-transport", "rust"]
    if tls:
        ca, cert, key = make_ca_and_cert(tmp_path)
        flags += ["--grpc-use-ssl", "true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key)]
    server = _serve(wheel_venv, repository, tmp_path, *flags)
    try:
        assert f"{RUST_LISTENING} 127.0.0.1:{server.grpc_port} (Rust transport)" in server.log(), server.log()[-3000:]
        secure = {"ssl": True, "root_certificates": str(ca)} if tls else {}
        client = grpcclient.InferenceServerClient(server.grpc_url, **secure)  # type: ignore[arg-type]
        _add_sub(client)
        client.close()
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.is_server_ready()
        http.close()
    finally:
        assert server.terminate() == 0


# ----------------------------------------------------------------------------------- source installs


@needs_cargo
def test_installing_from_source_builds_the_rust_transport(repository: Path, tmp_path: Path) -> None:
    """``pip install .`` in a fresh venv (uv's, with build isolation, as a user's pip does it)."""
    python = _venv(tmp_path / "venv", str(ROOT))
    assert _served_by(python).endswith("/site-packages/" + TRANSPORT), _served_by(python)
    server = _serve(python, repository, tmp_path)
    try:
        assert "(Rust transport)" in server.log() and "served by grpc.aio" not in server.log(), server.log()[-3000:]
        client = grpcclient.InferenceServerClient(server.grpc_url)
        _add_sub(client)
        client.close()
    finally:
        assert server.terminate() == 0


def test_without_cargo_the_package_installs_says_why_and_serves_grpc_with_grpcio(
    repository: Path, tmp_path: Path
) -> None:
    no_cargo = {
        **os.environ,
        "PATH": "/usr/bin:/bin",  # no rustup folder (the python runs by its full path)
        "CARGO_HOME": str(tmp_path / "no-cargo"),  # nor rustup's default ~/.cargo/bin
        "KUBEINFER_REQUIRE_GRPC_TRANSPORT": "0",
    }
    no_cargo.pop("CARGO", None)
    wheel, log = _pip_wheel(tmp_path / "dist", env=no_cargo)
    notice = "kubeinfer: building without the Rust gRPC transport: cargo is not on PATH"
    assert log.count(notice) == 1, log[-4000:]  # once, however often pip runs setup.py
    assert wheel.name == "kubeinfer-0.1.0-py3-none-any.whl", wheel.name  # pure: nothing built for a platform
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if n.endswith(".so")]

    python = _venv(tmp_path / "venv", str(wheel))
    server = _serve(python, repository, tmp_path)
    try:
        why = "gRPC served by grpc.aio, not the Rust transport: this installation has no Rust gRPC transport"
        assert server.log().count(why) == 1, server.log()[-3000:]
        client = grpcclient.InferenceServerClient(server.grpc_url)
        _add_sub(client)
        client.close()
    finally:
        assert server.terminate() == 0


def test_without_cargo_a_build_that_requires_the_transport_fails(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin", "CARGO_HOME": str(tmp_path / "none")}
    env.pop("CARGO", None)
    env["KUBEINFER_REQUIRE_GRPC_TRANSPORT"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode != 0
    assert "KUBEINFER_REQUIRE_GRPC_TRANSPORT=1 requires it" in done.stdout + done.stderr
    assert not list(tmp_path.glob("*.whl"))


def test_the_sdist_carries_the_crate(tmp_path: Path) -> None:
    """A source install builds the transport from the sdist: the crate, its lock file and patches are in it;
    cargo's target folder and built libraries are not."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = tmp_path.glob("kubeinfer-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    crate = ROOT / "server" / "grpc" / "rust"
    tracked = subprocess.run(["git", "ls-files", str(crate)], capture_output=True, text=True, cwd=ROOT, check=True)
    for path in tracked.stdout.split():
        assert path in names, f"{path} is not in the sdist"
    for required in ("setup.py", "pyproject.toml", "MANIFEST.in", "server/grpc/rust/Cargo.lock"):
        assert required in names
    assert not any(n.startswith("server/grpc/rust/target/") or n.endswith(".so") for n in names)
