"""The drop-in command line: Triton's flags and meanings, KServe's exact Triton ServingRuntime arguments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server import cli
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.kserve_runtime import KSERVE_TRITON_ARGS
from tests.support.repos import write_model
from tests.support.server import free_port, start_command

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

ADD_CONFIG = """
name: "add"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def add_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cli") / "repo"
    write_model(repo, "add", ADD_CONFIG, {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])})
    return repo


def _triton_cmd(repo: Path, *flags: str) -> tuple[list[str], int, int, int]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        str(BIN / "tritonserver"),
        f"--model-repository={repo}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        *flags,
    ]
    return cmd, http, grpc, metrics


def test_kserve_runtime_arguments_parse_to_triton_meanings() -> None:
    args = cli.build_parser(triton=True).parse_args(KSERVE_TRITON_ARGS[1:])
    assert args.model_repository == [Path("/mnt/models")]
    assert (args.http_port, args.grpc_port, args.metrics_port) == (8080, 9000, 8002)
    assert args.allow_http is True and args.allow_grpc is True and args.allow_metrics is True
    # Triton's defaults, not kubeinfer-server's
    assert args.exit_on_error is True and args.strict_readiness is True
    assert args.model_control_mode == "none"
    assert cli.compat_notices(args) == ([], [])


def _unshare_works() -> str:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) for private network/mount namespaces"
    probe = subprocess.run(
        ["unshare", "-rnm", "sh", "-c", "ip link set lo up && mount -t tmpfs tmpfs /mnt"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"this machine does not allow private network/mount namespaces: {probe.stderr.strip()}"
    return ""


def test_kserve_triton_serving_runtime_runs_the_image_unchanged(add_repo: Path) -> None:
    """The pod KServe creates: entry point kubeinfer-server + the runtime's args verbatim, fixed ports and path."""
    reason = _unshare_works()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        ["unshare", "-rnm", sys.executable, "-m", "tests.support.kserve_runtime", str(add_repo), "add"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    assert result["http"] == [[1.0, 2.0, 3.0, 4.0]]
    assert result["grpc"] == [[1.0, 2.0, 3.0, 4.0]]
    assert result["http_ready"] is True and result["grpc_model_ready"] is True
    assert float(result["metrics_success_line"].rsplit(" ", 1)[1]) == 2.0, result["metrics_success_line"]
    assert result["exit_code"] == 0, result["log"]


def test_tritonserver_command_with_triton_flags(add_repo: Path, tmp_path: Path) -> None:
    cmd, http, grpc, metrics = _triton_cmd(
        add_repo,
        "--id=triton",
        "--model-control-mode=explicit",
        "--load-model=add",
        "--strict-model-config=false",
        "--log-verbose=1",
        "--http-thread-count=8",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--exit-timeout-secs=5",
    )
    server = start_command(cmd, http, grpc, metrics, tmp_path / "server.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.get_server_metadata()["name"] == "triton"
        assert client.is_model_ready("add")
        a = np.ones((2, 4), dtype=np.float32)
        inputs = [httpclient.InferInput("A", [2, 4], "FP32"), httpclient.InferInput("B", [2, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("OUT"), a * 2)
        log = server.log()
        assert "--http-thread-count is ignored: HTTP is served by one asyncio event loop" in log
        assert " DEBUG " in log  # --log-verbose=1
    finally:
        assert server.terminate() == 0


def test_tritonserver_exits_when_a_model_fails_and_kubeinfer_server_keeps_serving(
    add_repo: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(add_repo, repo)
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 0\n')
    (repo / "broken" / "1").mkdir()
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")

    cmd, http, grpc, metrics = _triton_cmd(repo)
    server = start_command(cmd, http, grpc, metrics, tmp_path / "triton.log", wait=False)
    assert server.proc.wait(120) == 1, server.log()
    assert "exiting: 1 model(s) failed to load and --exit-on-error is true" in server.log()
    assert "failed to load broken version 1" in server.log()

    cmd, http, grpc, metrics = _triton_cmd(repo, "--exit-on-error=false", "--strict-readiness=false")
    server = start_command(cmd, http, grpc, metrics, tmp_path / "lenient.log")
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready() and client.is_model_ready("add") and not client.is_model_ready("broken")
    finally:
        server.terminate()


def test_strict_readiness_is_triton_default_for_tritonserver(add_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(add_repo, repo)
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    (repo / "broken" / "1").mkdir()
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"garbage")
    cmd, http, grpc, metrics = _triton_cmd(repo, "--exit-on-error=false")
    server = start_command(cmd, http, grpc, metrics, tmp_path / "strict.log", wait=False)
    try:
        deadline_client = httpclient.InferenceServerClient(server.http_url)
        for _ in range(1200):
            try:
                if deadline_client.is_model_ready("add"):
                    break
            except Exception:  # not listening yet
                pass
            assert server.alive(), server.log()
            time.sleep(0.1)
        assert deadline_client.is_model_ready("add")
        assert httpx.get(f"{server.base_url}/v2/health/ready").status_code == 503
    finally:
        server.terminate()


def test_cloud_listener_flags_are_checked_as_triton(add_repo: Path) -> None:
    """--allow-sagemaker/--allow-vertex-ai are served (tests/integration/test_sagemaker_vertex.py); a port
    clash stops the server with Triton's CheckPortCollision text."""
    proc = subprocess.run(
        [str(BIN / "tritonserver"), f"--model-repository={add_repo}", "--allow-sagemaker=true", "--http-port=8080"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        "The server cannot listen to HTTP requests and SageMaker requests at the same address and port 0.0.0.0:8080"
        in proc.stderr
    )


def test_model_store_and_model_repository_add_up(add_repo: Path, tmp_path: Path) -> None:
    """Triton's two spellings of the flag, given together, are two repositories whose models are merged; a cloud
    repository among others is refused (tests/integration/test_multiple_repositories.py has the rest)."""
    other = tmp_path / "other"
    write_model(
        other,
        "sub",
        ADD_CONFIG.replace('"add"', '"sub"'),
        {1: test_models.binary("sub", "Sub", TensorProto.FLOAT, ["batch", 4])},
    )
    cmd, http, grpc, metrics = _triton_cmd(other, f"--model-store={add_repo}")
    server = start_command(cmd, http, grpc, metrics, tmp_path / "two.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("add") and client.is_model_ready("sub")
    finally:
        server.terminate()
    proc = subprocess.run(
        [str(BIN / "tritonserver"), f"--model-store={add_repo}", "--model-repository=s3://bucket/models"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cannot be combined with other model repositories" in proc.stderr


def test_disable_auto_complete_config_requires_complete_configs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # no inputs/outputs: only auto-complete from the ONNX graph can make this servable
    write_model(
        repo,
        "bare",
        'backend: "onnxruntime"\nmax_batch_size: 8\n',
        {1: test_models.binary("bare", "Add", TensorProto.FLOAT, ["batch", 4])},
    )
    cmd, http, grpc, metrics = _triton_cmd(repo)
    server = start_command(cmd, http, grpc, metrics, tmp_path / "auto.log")
    try:
        assert httpclient.InferenceServerClient(server.http_url).is_model_ready("bare")
    finally:
        server.terminate()
    cmd, http, grpc, metrics = _triton_cmd(repo, "--disable-auto-complete-config")
    server = start_command(cmd, http, grpc, metrics, tmp_path / "strict.log", wait=False)
    assert server.proc.wait(120) == 1, server.log()
    assert "failed to load bare" in server.log()


def test_backend_config_default_max_batch_size(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo,
        "bare",
        'backend: "onnxruntime"\n',
        {1: test_models.binary("bare", "Add", TensorProto.FLOAT, ["batch", 4])},
    )
    cmd, http, grpc, metrics = _triton_cmd(repo, "--backend-config=default-max-batch-size=16")
    server = start_command(cmd, http, grpc, metrics, tmp_path / "server.log")
    try:
        config = httpclient.InferenceServerClient(server.http_url).get_model_config("bare")
        assert config["max_batch_size"] == 16
    finally:
        server.terminate()


def test_compat_notices_unit() -> None:
    parser = cli.build_parser(triton=True)
    args = parser.parse_args(
        ["--model-store=/x", "--grpc-use-ssl=false", "--allow-sagemaker=false", "--metrics-interval-ms=500"]
    )
    warnings, errors = cli.compat_notices(args)
    assert errors == []
    assert warnings == ["--metrics-interval-ms is ignored: gauges are read at scrape time"]
    args = parser.parse_args(["--model-store=/x", "--allow-vertex-ai=true", "--sagemaker-thread-count=4"])
    assert cli.compat_notices(args) == (
        ["--sagemaker-thread-count is ignored: SageMaker requests are served by the asyncio event loop"],
        [],
    )
    args = parser.parse_args(["--model-store=/x", "--model-namespacing=true"])  # served (test_model_namespacing.py)
    assert cli.compat_notices(args) == ([], [])
    assert cli.parse_backend_config(["default-max-batch-size=8", "onnxruntime,enable-pinned-input=false"]) == {
        "": {"default-max-batch-size": "8"},
        "onnxruntime": {"enable-pinned-input": "false"},
    }
