"""Python models in their own stub processes: instances run in parallel, a crash or a hang fails only
the requests the stub held (Triton 2.51's text) and the stub is restarted, other models keep serving.

Triton 2.51 (the nvidia-pytriton wheel's tritonserver, same models) answered the request a segfaulting
or stopped stub held with ``Stub process '<instance>' is not healthy.`` (HTTP 500); it then kept failing
every request with that text, kept reporting the model ready and never started a new stub. Here the
instance reports not ready while a new stub starts, and serves again.
"""

from __future__ import annotations

import json
import queue
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

# ctypes null dereference (SIGSEGV), os._exit, or SIGSTOP (a hang) on request; else the stub's pid
CRASHER = """
import ctypes
import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 1:
                ctypes.string_at(0)  # reads address 0: SIGSEGV
            elif mode == 2:
                os._exit(3)
            elif mode == 3:
                os.kill(os.getpid(), signal.SIGSTOP)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return responses
"""

CRASHER_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

# three requests leave together (a lone one waits an hour for company): one execute holds all three
BATCHED_CRASHER_CONFIG = """
name: "batch_crasher"
backend: "python"
max_batch_size: 4
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 3600000000 }
"""

BATCHED_CRASHER = CRASHER.replace(
    'mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])',
    'mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0, 0])',
).replace("np.array([os.getpid()], np.int64)", "np.array([[os.getpid()]], np.int64)")

# a crasher whose initialize takes 12 s while <model folder>/slow exists (a slow restart)
SLOW_START = CRASHER.replace(
    "class TritonPythonModel:",
    """class TritonPythonModel:
    def initialize(self, args):
        import time
        if os.path.exists(os.path.join(args["model_repository"], "slow")):
            time.sleep(12)
""",
)

# pure-Python work; reports its process and its execution window on the system-wide monotonic clock
BUSY = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            start = time.monotonic()
            stamps = []
            x = 0
            while time.monotonic() - start < seconds:
                for i in range(2000):
                    x += i * i
                stamps.append(time.monotonic())
            window = {"pid": os.getpid(), "start": start, "end": time.monotonic(), "stamps": stamps}
            out = np.array([json.dumps(window).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("WINDOW", out)]))
        return responses
"""

BUSY_CONFIG = """
name: "busy"
backend: "python"
max_batch_size: 0
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "WINDOW" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

ECHO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""

ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


# where it runs, and a BLS call to the (stub) echo model from there
WHERE = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            echoed = pb_utils.InferenceRequest(model_name="echo", inputs=[pb_utils.Tensor("X", x.as_numpy())],
                                               requested_output_names=["Y"]).exec()
            if echoed.has_error():
                raise pb_utils.TritonModelException(echoed.error().message())
            y = pb_utils.get_output_tensor_by_name(echoed, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y),
                                                         pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return responses
"""

WHERE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
{parameters}
"""


# decoupled: answers, then (on request) crashes from its sender thread with the stream still open
STREAMER = """
import ctypes
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            crash = bool(pb_utils.get_input_tensor_by_name(request, "CRASH").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.stream, args=(sender, crash), daemon=True).start()
        return None

    def stream(self, sender, crash):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        if crash:
            ctypes.string_at(0)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([2], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

STREAMER_CONFIG = """
name: "streamer"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "CRASH" data_type: TYPE_BOOL dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _model(repo: Path, name: str, config: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("stubs") / "repo"
    _model(repo, "crasher", CRASHER_CONFIG.format(name="crasher", count=1), CRASHER)
    _model(repo, "crash_loop", CRASHER_CONFIG.format(name="crash_loop", count=1), CRASHER)
    _model(repo, "pair", CRASHER_CONFIG.format(name="pair", count=2), SLOW_START)
    _model(repo, "batch_crasher", BATCHED_CRASHER_CONFIG, BATCHED_CRASHER)
    _model(repo, "busy", BUSY_CONFIG, BUSY)
    _model(repo, "echo", ECHO_CONFIG, ECHO)
    _model(repo, "streamer", STREAMER_CONFIG, STREAMER)
    _model(repo, "where_stub", WHERE_CONFIG.format(name="where_stub", parameters=""), WHERE)
    in_process = 'parameters { key: "KUBEINFER_IN_PROCESS" value: { string_value: "true" } }'
    _model(repo, "where_in_process", WHERE_CONFIG.format(name="where_in_process", parameters=in_process), WHERE)
    server = start_server(
        repo,
        "--backend-config=python,stub-timeout-seconds=2",
        "--backend-config=python,stub-health-interval-seconds=0.5",
        log_dir=repo.parent,
    )
    yield server
    server.terminate()


def _mode(model: str, server: ServerProcess, mode: int) -> int:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    t = httpclient.InferInput("MODE", [1], "INT32")
    t.set_data_from_numpy(np.array([mode], np.int32))
    try:
        return int(client.infer(model, [t]).as_numpy("PID")[0])
    finally:
        client.close()


def _echo(server: ServerProcess, values: list[float]) -> list[float]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    t = httpclient.InferInput("X", [len(values)], "FP32")
    t.set_data_from_numpy(np.array(values, np.float32))
    try:
        return [float(v) for v in client.infer("echo", [t]).as_numpy("Y")]
    finally:
        client.close()


def _ready(server: ServerProcess, model: str) -> bool:
    return httpx.get(f"{server.base_url}/v2/models/{model}/ready", timeout=10).status_code == 200


def _index(server: ServerProcess) -> dict[str, dict[str, Any]]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    return {row["name"]: row for row in rows}


def test_two_instances_of_a_cpu_bound_model_run_at_the_same_time(server: ServerProcess) -> None:
    def call(_: int) -> dict[str, Any]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        t = httpclient.InferInput("SECONDS", [1], "FP32")
        t.set_data_from_numpy(np.array([1.0], np.float32))
        try:
            return dict(json.loads(client.infer("busy", [t]).as_numpy("WINDOW")[0]))
        finally:
            client.close()

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(call, range(2))
    assert a["pid"] != b["pid"]  # two processes, two interpreters, two GILs
    overlap = min(a["end"], b["end"]) - max(a["start"], b["start"])
    assert overlap > 0.5, (a["start"], a["end"], b["start"], b["end"])
    # both made progress within the same millisecond for part of the overlap (one GIL would alternate
    # every 5 ms); how much depends on how busy the machine's two cores are, so it is reported, not required
    bins_a = {int(t * 1000) for t in a["stamps"]}
    bins_b = {int(t * 1000) for t in b["stamps"]}
    print(f"milliseconds in which both instances progressed: {len(bins_a & bins_b)} of {int(overlap * 1000)}")


def test_a_segfault_fails_only_the_request_it_held_and_the_stub_restarts(server: ServerProcess) -> None:
    pid = _mode("crasher", server, 0)
    with pytest.raises(InferenceServerException) as info:
        _mode("crasher", server, 1)
    assert info.value.status() == "500"
    assert info.value.message() == "Stub process 'crasher_0_0' is not healthy."
    assert _echo(server, [1.0, 2.0]) == [1.0, 2.0]  # another Python model keeps serving
    wait_for("the crasher to be ready again", lambda: _ready(server, "crasher"))
    new_pid = _mode("crasher", server, 0)
    assert new_pid != pid
    log = server.log()
    assert f"the stub process of instance 'crasher_0_0' (pid {pid}) was killed by signal SIGSEGV" in log
    assert "restart 1 in 0.0 s" in log
    assert f"instance 'crasher_0_0' serves again (stub process {new_pid})" in log


def test_requests_waiting_for_a_crashed_instance_run_on_its_new_stub(server: ServerProcess) -> None:
    """The crashing request's successors were queued for the same (only) instance: they wait for the
    restart instead of failing."""
    with ThreadPoolExecutor(4) as pool:
        crash = pool.submit(_mode, "crasher", server, 2)  # os._exit(3)
        time.sleep(0.2)
        after = [pool.submit(_mode, "crasher", server, 0) for _ in range(3)]
        with pytest.raises(InferenceServerException) as info:
            crash.result()
        pids = {f.result() for f in after}
    assert info.value.message() == "Stub process 'crasher_0_0' is not healthy."
    assert len(pids) == 1
    assert "exited with code 3" in server.log()


def test_a_stub_that_stops_answering_is_killed_and_restarted(server: ServerProcess) -> None:
    pid = _mode("crasher", server, 0)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        _mode("crasher", server, 3)  # SIGSTOP: the process is there, but answers nothing
    assert info.value.message() == "Stub process 'crasher_0_0' is not healthy."
    assert time.monotonic() - started < 30  # stub-timeout-seconds=2 (and a 0.5 s health interval)
    wait_for("the crasher to be ready again", lambda: _ready(server, "crasher"))
    assert _mode("crasher", server, 0) != pid
    assert f"(pid {pid}) did not answer its health check within" in server.log()


def test_a_stub_that_keeps_dying_is_given_up_and_the_model_is_not_ready(server: ServerProcess) -> None:
    for _ in range(6):
        wait_for("crash_loop to serve", lambda: _ready(server, "crash_loop"), timeout=60)
        with pytest.raises(InferenceServerException):
            _mode("crash_loop", server, 1)
    wait_for("crash_loop to be given up", lambda: "is not restarted" in _index(server)["crash_loop"]["reason"])
    row = _index(server)["crash_loop"]
    assert row["state"] == "READY"  # loaded, as Triton's index keeps it; readiness says it cannot serve
    assert "died 6 times in 60 s" in row["reason"]
    assert not _ready(server, "crash_loop")
    with pytest.raises(InferenceServerException) as info:
        _mode("crash_loop", server, 0)
    assert info.value.message() == "Stub process 'crash_loop_0_0' is not healthy."
    assert _echo(server, [3.0]) == [3.0]


@pytest.mark.parametrize("model", ["where_stub", "where_in_process"])
def test_a_model_runs_in_a_stub_unless_it_opts_in_to_the_servers_process(server: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    t = httpclient.InferInput("X", [3], "FP32")
    t.set_data_from_numpy(np.array([1.0, 2.0, 3.0], np.float32))
    result = client.infer(model, [t])
    client.close()
    assert result.as_numpy("Y").tolist() == [1.0, 2.0, 3.0]  # through BLS to a stub model, either way
    pid = int(result.as_numpy("PID")[0])
    assert (pid == server.proc.pid) == (model == "where_in_process")


def test_a_stream_open_when_its_stub_dies_ends_with_the_error_after_what_was_sent(server: ServerProcess) -> None:
    def stream(crash: bool) -> list[tuple[Any, Any]]:
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        t = grpcclient.InferInput("CRASH", [1], "BOOL")
        t.set_data_from_numpy(np.array([crash]))
        client.async_stream_infer("streamer", [t])
        items = [got.get(timeout=60), got.get(timeout=60)]
        client.stop_stream()
        client.close()
        return items

    (first, e1), (_, e2) = stream(crash=True)
    assert e1 is None and first.as_numpy("OUT").tolist() == [1]
    assert e2 is not None and e2.message() == "Stub process 'streamer_0' is not healthy."
    wait_for("streamer to be ready again", lambda: _ready(server, "streamer"))
    (one, e1), (two, e2) = stream(crash=False)
    assert e1 is None and e2 is None
    assert [one.as_numpy("OUT").tolist(), two.as_numpy("OUT").tolist()] == [[1], [2]]


def test_while_an_instance_restarts_the_other_one_takes_its_work(server: ServerProcess) -> None:
    repo = Path(server.args[server.args.index("--model-repository") + 1])
    pids = {_mode("pair", server, 0) for _ in range(6)}
    assert len(pids) == 2
    (repo / "pair" / "slow").touch()  # the next initialize takes 12 s (far longer than the 4 calls may)
    try:
        with pytest.raises(InferenceServerException):
            _mode("pair", server, 1)
        started = time.monotonic()
        answered = [_mode("pair", server, 0) for _ in range(4)]
        took = time.monotonic() - started
        assert not _ready(server, "pair")  # until the other is back
    finally:
        (repo / "pair" / "slow").unlink()
    (survivor,) = set(answered)  # all by the instance that did not die, without waiting for the other
    assert survivor in pids
    assert took < 4, took
    wait_for("pair to be ready again", lambda: _ready(server, "pair"), timeout=60)
    assert len({_mode("pair", server, 0) for _ in range(6)}) == 2


def test_every_request_of_the_batch_a_stub_died_with_gets_the_error(server: ServerProcess) -> None:
    def call(mode: int) -> tuple[str, str]:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        t = httpclient.InferInput("MODE", [1, 1], "INT32")
        t.set_data_from_numpy(np.array([[mode]], np.int32))
        try:
            return "ok", str(client.infer("batch_crasher", [t]).as_numpy("PID")[0, 0])
        except InferenceServerException as exc:
            return exc.status() or "", exc.message()
        finally:
            client.close()

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(call, [0, 1, 0]))  # the middle one segfaults the stub, in one execute
    assert results == [("500", "Stub process 'batch_crasher_0' is not healthy.")] * 3
    assert _echo(server, [4.0]) == [4.0]
    wait_for("batch_crasher to be ready again", lambda: _ready(server, "batch_crasher"))
    with ThreadPoolExecutor(3) as pool:
        assert [status for status, _ in pool.map(call, [0, 0, 0])] == ["ok"] * 3
