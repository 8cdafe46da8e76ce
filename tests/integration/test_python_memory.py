"""Unloading a Python model gives its memory back: the model's allocations live in its stub process,
which ends with the unload. 200 load/unload cycles of a model holding 50 MB leave the server's resident
memory and open files where they were, and no stub process behind."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, start_server

HOLDS_50_MB = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones(50 * 1024 * 1024, dtype=np.uint8)  # 50 MB, touched

    def execute(self, requests):
        total = np.array([int(self.weights.sum())], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total)]) for _ in requests]
"""

CONFIG = """
name: "weights"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

CYCLES = 200
WARM_UP = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("memory")
    (root / "repo" / "weights" / "1").mkdir(parents=True)
    (root / "repo" / "weights" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (root / "repo" / "weights" / "1" / "model.py").write_text(HOLDS_50_MB)
    server = start_server(root / "repo", "--model-control-mode=explicit", log_dir=root)
    yield server
    server.terminate()


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _children(pid: int) -> list[int]:
    """Child processes of any of ``pid``'s threads (stubs are started from worker threads)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def _cycle(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    r = httpx.post(f"{server.base_url}/v2/repository/models/weights/load", json={}, timeout=120)
    assert r.status_code == 200, r.text
    t = httpclient.InferInput("X", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    assert int(client.infer("weights", [t]).as_numpy("TOTAL")[0]) == 50 * 1024 * 1024
    r = httpx.post(f"{server.base_url}/v2/repository/models/weights/unload", json={}, timeout=120)
    assert r.status_code == 200, r.text


# two stub processes start per load (auto-complete, then the instance): ~1-3 s a cycle on a busy 2-core machine
@pytest.mark.timeout(1800)
def test_load_unload_cycles_give_the_memory_back(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    pid = server.proc.pid
    for _ in range(WARM_UP):
        _cycle(server, client)
    r = httpx.post(f"{server.base_url}/v2/repository/models/weights/load", json={}, timeout=120)
    assert r.status_code == 200 and len(_children(pid)) == 1  # the model's stub, while it is loaded
    httpx.post(f"{server.base_url}/v2/repository/models/weights/unload", json={}, timeout=120).raise_for_status()
    before = _rss_kb(pid)
    fds_before = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    peak = before
    for _ in range(CYCLES):
        _cycle(server, client)
        peak = max(peak, _rss_kb(pid))
    after = _rss_kb(pid)
    fds_after = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    client.close()
    print(
        f"server RSS: {before / 1024:.1f} MB after {WARM_UP} cycles, {after / 1024:.1f} MB after {CYCLES} more "
        f"(peak {peak / 1024:.1f} MB); each load held 50 MB in its stub"
    )
    assert after - before < 5 * 1024, (before, after)
    assert fds_after <= fds_before + 2, (fds_before, fds_after)  # sockets and shared-memory segments closed
    assert _children(pid) == []  # every stub ended with its unload
