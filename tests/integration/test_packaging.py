"""The built wheel (not only the editable source tree) imports, carries its data files, and serves."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("kubeinfer-*.whl")
    unpacked = out / "site"
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
