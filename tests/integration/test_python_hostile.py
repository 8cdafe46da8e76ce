"""Python models against the server and each other: a stub runs a model's code as the server's user.

What such code could do before, and must not now:

* open ``/proc/<server pid>/fd/<n>`` (or another stub's) and read the shared-memory segments there, which
  hold other models' tensors: the server and every stub make themselves non-dumpable, so the kernel
  refuses those files (and ``mem``, ptrace) to processes of the same user;
* truncate a shared-memory segment it holds the descriptor of, so that the server's next touch of its
  mapping is a SIGBUS: the server maps none (``ipc``), so a truncated stub segment fails that response
  with the reason, a truncated server segment grows back, and the server keeps serving.

The kernel lets root read any process's ``/proc`` files (``CAP_SYS_PTRACE``, ``CAP_DAC_*``). When the
tests run as root, the server therefore runs under ``setpriv`` without those capabilities: a process of
the same user with no privilege over others, which is what the server is in a pod. (Running it as
another user is not possible everywhere: the interpreter may live in root's home.) As root without
them, a process still owns a non-dumpable process's ``/proc/<pid>`` entries (the kernel gives them to
root), so listing ``fd/`` works there, but opening or reading a link does not; as any other user,
listing is refused too, and that is asserted when the tests do not run as root.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server

#: root's powers over other processes' /proc files, dropped so the server is just "the same user"
UNPRIVILEGED = ["setpriv", "--bounding-set", "-sys_ptrace,-dac_override,-dac_read_search"]

# echoes X and says where it runs: the tensor another model should not be able to read
VICTIM = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()),
                                            pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for r in requests]
"""

VICTIM_CONFIG = """
name: "victim"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_UINT8 dims: [ -1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""

# reads what it can of process PID's descriptors and memory through /proc, looking for NEEDLE
SNOOP = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def probe(pid, needle):
    report = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
        report["list"] = "ok"
    except OSError as exc:
        names = [str(n) for n in range(256)]
        report["list"] = type(exc).__name__
    opened = denied = 0
    found = False
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            target = os.readlink(path)
        except FileNotFoundError:
            continue
        except PermissionError:
            denied += 1
            continue
        if "kubeinfer-" not in target:  # a shared-memory segment: /dev/shm/kubeinfer-<pid>-<random> (deleted)
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except PermissionError:
            denied += 1
            continue
        opened += 1
        found = found or needle in data
    report.update(opened=opened, denied=denied, found=found)
    for name in ("mem", "environ", "status"):
        try:
            with open(f"/proc/{pid}/{name}", "rb"):
                report[name] = "ok"
        except OSError as exc:
            report[name] = type(exc).__name__
    return report


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pid = int(pb_utils.get_input_tensor_by_name(request, "PID").as_numpy()[0])
            needle = pb_utils.get_input_tensor_by_name(request, "NEEDLE").as_numpy().tobytes()
            report = json.dumps(probe(pid, needle)).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([report], np.object_))]))
        return responses
"""

SNOOP_CONFIG = """
name: "snoop"
backend: "python"
max_batch_size: 0
input [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "NEEDLE" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# when X[0] < 0, truncates to 0 bytes the shared-memory segments of WHOSE ("own": its stub's, once its
# response is written, just before the stub sends it; "server": the server's, which it holds the
# descriptors of); answers X, each element repeated
TRUNCATOR = """
import os
import weakref

import numpy as np
import triton_python_backend_utils as pb_utils


def truncate(pid):
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(f"/dev/shm/kubeinfer-{pid}-"):
            os.ftruncate(int(name), 0)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().copy()  # a view would fault after
            if x[0] >= 0:
                pass
            elif WHOSE == "own":
                # runs when the stub lets go of the request: after it wrote the response, before it sends it
                weakref.finalize(request, truncate, os.getpid())
            else:
                truncate(os.getppid())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.repeat(x, 16384))]))
        return responses
"""

TRUNCATOR_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def _model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(code)


def _as_same_user() -> list[str] | None:
    """The wrapper that leaves the server no power over other processes of its user (root only)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run the server without root's CAP_SYS_PTRACE")
    return UNPRIVILEGED


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hostile")
    repo = root / "repo"
    _model(repo, "victim", VICTIM_CONFIG, VICTIM)
    _model(repo, "snoop", SNOOP_CONFIG, SNOOP)
    for whose in ("own", "server"):
        name = f"truncates_{whose}"
        _model(repo, name, TRUNCATOR_CONFIG.format(name=name), f"WHOSE = {whose!r}\n{TRUNCATOR}")
    server = start_server(repo, log_dir=root, wrapper=_as_same_user())
    yield server
    server.terminate()


def _victim(client: httpclient.InferenceServerClient, secret: np.ndarray) -> int:
    x = httpclient.InferInput("X", list(secret.shape), "UINT8")
    x.set_data_from_numpy(secret)
    result = client.infer("victim", [x])
    np.testing.assert_array_equal(result.as_numpy("Y"), secret)
    return int(result.as_numpy("PID")[0])


def _snoop(client: httpclient.InferenceServerClient, pid: int, needle: np.ndarray) -> dict[str, Any]:
    p = httpclient.InferInput("PID", [1], "INT64")
    p.set_data_from_numpy(np.array([pid], np.int64))
    n = httpclient.InferInput("NEEDLE", list(needle.shape), "UINT8")
    n.set_data_from_numpy(needle)
    return dict(json.loads(client.infer("snoop", [p, n]).as_numpy("REPORT")[0]))


def test_a_model_cannot_read_the_descriptors_of_the_server_or_of_another_stub(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    secret = np.frombuffer(b"another model's tensor " + os.urandom(16).hex().encode(), np.uint8)
    victim_pid = _victim(client, secret)  # the secret now lies in the server's segment and the victim stub's
    for pid in (server.proc.pid, victim_pid):
        report = _snoop(client, pid, secret)
        assert report["opened"] == 0 and not report["found"], (pid, report)
        assert report["denied"] > 0 and report["mem"] == "PermissionError", (pid, report)
        assert report["status"] == "ok", report  # what ps and top read stays readable
        if os.geteuid() != 0:
            assert report["list"] == report["environ"] == "PermissionError", (pid, report)
    assert _victim(client, secret) == victim_pid  # both serve on
    client.close()


def _truncator(client: httpclient.InferenceServerClient, name: str, truncate: bool = False) -> np.ndarray:
    x = httpclient.InferInput("X", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32) - (1 if truncate else 0))
    return client.infer(name, [x]).as_numpy("Y")


def test_a_stub_that_truncates_its_segment_fails_that_response_and_the_server_serves_on(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    _truncator(client, "truncates_own")  # the server knows the stub's segment from now on
    with pytest.raises(InferenceServerException) as failed:
        _truncator(client, "truncates_own", truncate=True)
    assert "Python model instance 'truncates_own_0' sent an output the server cannot read" in str(failed.value)
    assert "which the stub's process truncated to 0 bytes" in str(failed.value)
    assert server.alive()
    secret = np.arange(100, dtype=np.uint8)
    _victim(client, secret)  # other models answer
    client.close()


def test_a_stub_that_truncates_the_servers_segments_does_not_bring_it_down(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    expected = np.repeat(np.arange(4, dtype=np.float32), 16384)
    np.testing.assert_array_equal(_truncator(client, "truncates_server", truncate=True), expected - 1)
    # the server writes the next inputs into the truncated segment: with pwrite, not through a mapping
    np.testing.assert_array_equal(_truncator(client, "truncates_server"), expected)
    assert server.alive()
    _victim(client, np.arange(100, dtype=np.uint8))
    ready = httpx.get(f"{server.base_url}/v2/models/truncates_server/ready", timeout=10)
    assert ready.status_code == 200
    client.close()
