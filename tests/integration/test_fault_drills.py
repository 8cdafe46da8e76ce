"""Issue 15 part 5, fault drills: models that fail, files that cannot be read or written, a repository that
vanishes, clients that drop, and memory over many requests and load/unload cycles.

After every drill the server answers health and another model's requests, and each drill prints one
summary line (inputs tried, crashes, 5xx on bad input, failed good requests, RSS growth) in the
"drills" section of the pytest output. The drill server runs without the DAC-override capabilities
(``setpriv``), so a file with mode 000 is unreadable to it even on machines where tests run as root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import onnx
import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.volume.repository_writer import RepositoryWriter
from onnx import TensorProto

from tests.support.drills import mib, report, rss_bytes
from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

SETPRIV = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
PY_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PY_MODELS = {
    "raises": "raise RuntimeError('drill: execute raised')",
    # no response for its request (Triton refuses that; a wrong output shape or datatype it serves as given)
    "no_response": "return []",
    "hang": "time.sleep(6)\n        return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', np.zeros(4, np.float32))]) for r in requests]",
}  # fmt: skip
BODY = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [4], "data": [1.0, -1.0, 2.0, -2.0]}]}
GOOD = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1.0, -1.0, 2.0, -2.0]}]}


def _python_model(repo: Path, name: str, body: str) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PY_CONFIG)
    (folder / "1" / "model.py").write_text(
        "import time\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\n"
        f"class TritonPythonModel:\n    def execute(self, requests):\n        {body}\n"
    )


def _relu(repo: Path, name: str) -> None:
    write_model(
        repo,
        name,
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n',
        {1: unary(name, "Relu", TensorProto.FLOAT, ["b", 4])},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to drop the server's DAC capabilities")
    repo = tmp_path_factory.mktemp("drills") / "repo"
    _relu(repo, "good")
    _relu(repo, "cycled")
    for name, body in PY_MODELS.items():
        _python_model(repo, name, body)
    s = start_server(
        repo, "--model-control-mode", "explicit", "--load-model", "*", "--request-timeout", "2", "--shutdown-timeout", "5",
        wrapper=SETPRIV,
    )  # fmt: skip
    yield s
    s.terminate(30)


def _good(server: ServerProcess) -> bool:
    r = httpx.post(f"{server.base_url}/v2/models/good/infer", json=GOOD, timeout=30)
    health = httpx.get(f"{server.base_url}/v2/health/ready", timeout=10).status_code
    return r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 0.0, 2.0, 0.0] and health == 200


def _rss(server: ServerProcess) -> int:
    return rss_bytes(server.proc.pid)


# ------------------------------------------------------------------------------------- broken models


@pytest.mark.parametrize(
    ("model", "status", "message"),
    [
        ("raises", 500, "drill: execute raised"),
        ("no_response", 500, "Number of InferenceResponse objects do not match"),
        ("hang", 504, "did not finish within the server's request timeout of 2s"),
    ],
)
def test_a_broken_model_fails_its_own_requests_only(
    server: ServerProcess, model: str, status: int, message: str
) -> None:
    before = _rss(server)
    failed_good = 0
    tries = 3 if model == "hang" else 20
    with ThreadPoolExecutor(4) as pool:
        bad = pool.map(
            lambda _: httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=BODY, timeout=60), range(tries)
        )
        goods = [pool.submit(_good, server) for _ in range(10)]
        answers = list(bad)
        failed_good = sum(not g.result() for g in goods)
    report(
        f"drill model {model}",
        inputs=tries,
        crashes=int(not server.alive()),
        failed_good=failed_good,
        rss=mib(_rss(server) - before),
    )
    assert server.alive() and failed_good == 0
    for r in answers:
        assert r.status_code == status and message in r.json()["error"], r.text
    assert _good(server)


# ------------------------------------------------------------------------------- unreadable files


def test_permission_denied_while_loading(server: ServerProcess, tmp_path: Path) -> None:
    repo = Path(server.args[server.args.index("--model-repository") + 1])
    _relu(repo, "locked")
    model_file = repo / "locked" / "1" / "model.onnx"
    os.chmod(model_file, 0)
    try:
        r = httpx.post(f"{server.base_url}/v2/repository/models/locked/load", json={}, timeout=60)
        assert r.status_code == 400 and "Permission denied" in r.json()["error"], r.text
        os.chmod(repo / "locked" / "config.pbtxt", 0)
        r = httpx.post(f"{server.base_url}/v2/repository/models/locked/load", json={}, timeout=60)
        assert r.status_code == 400 and "Permission denied" in r.json()["error"], r.text
        ok = _good(server)
        report(
            "drill permission denied while loading", inputs=2, crashes=int(not server.alive()), failed_good=int(not ok)
        )
        assert ok
    finally:
        os.chmod(model_file, 0o644)
        os.chmod(repo / "locked" / "config.pbtxt", 0o644)
    assert httpx.post(f"{server.base_url}/v2/repository/models/locked/load", json={}, timeout=60).status_code == 200


# ------------------------------------------------------------------------------ clients that drop


def test_a_thousand_clients_connect_and_drop_mid_request(server: ServerProcess) -> None:
    before = _rss(server)
    head = b"POST /v2/models/good/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"

    def drop(i: int) -> None:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
            if i % 3 == 0:
                sock.sendall(head[: 20 + i % 40])  # mid-headers
            elif i % 3 == 1:
                sock.sendall(head + b'{"inputs": [')  # mid-body
            else:
                sock.sendall(head.replace(b"200", b"%d" % len(b'{"inputs": []}')) + b'{"inputs": []}')  # whole, no read
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(drop, range(1000)))
    ok = wait_for("the server answers after the drops", lambda: _good(server), timeout=60)
    growth = _rss(server) - before
    report(
        "drill 1000 clients dropping mid-request",
        inputs=1000,
        crashes=int(not server.alive()),
        failed_good=int(not ok),
        rss=mib(growth),
    )
    assert server.alive() and ok
    assert growth < 32 << 20


# ------------------------------------------------------------------------------------ memory


def test_memory_returns_to_baseline_after_requests_and_load_cycles(server: ServerProcess) -> None:
    """RSS bounds: 10,000 requests grow it by < 24 MiB, 100 load/unload cycles by < 48 MiB (after a warm-up)."""

    def burst(n: int) -> int:
        failed = 0
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            for _ in range(n):
                r = client.post("/v2/models/good/infer", json=GOOD)
                failed += r.status_code != 200
        return failed

    def cycles(n: int) -> int:
        failed = 0
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            for _ in range(n):
                failed += client.post("/v2/repository/models/cycled/unload", json={}).status_code != 200
                failed += client.post("/v2/repository/models/cycled/load", json={}).status_code != 200
        return failed

    with ThreadPoolExecutor(4) as pool:  # warm-up: allocator pools, ORT arenas, caches
        assert sum(pool.map(burst, [250] * 4)) == 0
    assert cycles(10) == 0
    base = _rss(server)
    with ThreadPoolExecutor(4) as pool:
        failed = sum(pool.map(burst, [2500] * 4))
    after_requests = _rss(server)
    report(
        "drill 10,000 requests",
        inputs=10_000,
        crashes=int(not server.alive()),
        failed_good=failed,
        rss=mib(after_requests - base),
    )
    failed_cycles = cycles(100)
    after_cycles = _rss(server)
    report(
        "drill 100 load/unload cycles",
        inputs=100,
        crashes=int(not server.alive()),
        failed_good=failed_cycles,
        rss=mib(after_cycles - after_requests),
    )
    assert failed == 0 and failed_cycles == 0
    assert after_requests - base < 24 << 20, mib(after_requests - base)
    assert after_cycles - after_requests < 48 << 20, mib(after_cycles - after_requests)
    assert _good(server)


# ---------------------------------------------------- a full volume, a vanishing repository (poll mode)


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "volume"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a 3 MiB tmpfs for the disk-full drill: {proc.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _spec(path: str) -> dict:
    return {
        "server": "pool",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versionPolicy": {"all": {}},
        "versions": [{"version": 1, "source": {"path": "uploads/relu.onnx"}}, {"version": 2, "source": {"path": path}}],
    }


def test_disk_full_while_rendering_and_a_vanishing_repository(small_volume: Path, tmp_path: Path) -> None:
    uploads = small_volume / "ns" / "uploads"
    uploads.mkdir(parents=True)
    onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["b", 4]), uploads / "relu.onnx")
    (uploads / "big.onnx").write_bytes(os.urandom(2 << 20))  # the volume cannot hold a second copy
    writer = RepositoryWriter(small_volume)
    server_dir = writer.server_dir("ns", "ns/pool")
    writer.sync_model(
        server_dir, render_model("m", {**_spec("uploads/relu.onnx"), "versions": _spec("x")["versions"][:1]})
    )
    server = start_server(server_dir, "--model-control-mode", "poll", "--repository-poll-secs", "0.5", log_dir=tmp_path)
    try:
        before = _rss(server)

        def serves() -> bool:
            r = httpx.post(f"{server.base_url}/v2/models/m/infer", json=GOOD, timeout=30)
            return r.status_code == 200

        assert serves()
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model("m", _spec("uploads/big.onnx")))
        assert info.value.reason == "WriteFailed" and "No space left on device" in info.value.message
        assert sorted(p.name for p in (server_dir / "m").iterdir()) == ["1", "config.pbtxt"]  # nothing half-written
        full_ok = serves()
        report(
            "drill disk full while rendering", inputs=1, crashes=int(not server.alive()), failed_good=int(not full_ok)
        )
        assert full_ok

        # the repository folder vanishes (an unmounted volume, a renamed folder): keep serving, then pick up again
        gone = server_dir.with_name(".gone")
        os.rename(server_dir, gone)
        wait_for("the server notices", lambda: "cannot be read" in server.log(), timeout=30)
        vanished_ok = all(serves() for _ in range(10))
        os.rename(gone, server_dir)
        writer.sync_model(
            server_dir, render_model("m2", {**_spec("uploads/relu.onnx"), "versions": _spec("x")["versions"][:1]})
        )
        wait_for(
            "a model added after it came back",
            lambda: httpx.post(f"{server.base_url}/v2/models/m2/infer", json=GOOD, timeout=30).status_code == 200,
            timeout=30,
        )
        report(
            "drill repository vanishing while polling",
            inputs=10,
            crashes=int(not server.alive()),
            failed_good=int(not vanished_ok),
            rss=mib(_rss(server) - before),
        )
        assert vanished_ok and serves()
    finally:
        server.terminate(30)


def test_a_model_stuck_in_execute_does_not_keep_the_process_alive_after_shutdown(tmp_path: Path) -> None:
    """SIGTERM with a request stuck in a model: the server exits after --shutdown-timeout, not when the model returns."""
    repo = tmp_path / "repo"
    returned = tmp_path / "model-returned"  # written by the model when its execute returns
    _python_model(repo, "stuck", f"time.sleep(40)\n        open({str(returned)!r}, 'w').close()\n        return []")
    server = start_server(repo, "--request-timeout", "1", "--shutdown-timeout", "2", log_dir=tmp_path)
    r = httpx.post(f"{server.base_url}/v2/models/stuck/infer", json=BODY, timeout=30)
    assert r.status_code == 504
    code = server.terminate(60)
    report("drill model stuck in execute at shutdown", inputs=1, crashes=int(code != 0), failed_good=0)
    assert code == 0 and "exiting with stuck version 1 still executing" in server.log()
    assert not returned.exists()  # the process was gone before the model returned
