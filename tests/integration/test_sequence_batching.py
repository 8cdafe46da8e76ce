"""Sequence batching: interleaved sequences with implicit state checked step by step, control inputs,
backlog, idle timeout, uint64 and string correlation ids, and Triton's errors, over HTTP and gRPC."""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""
OUTPUTS = """
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "END_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
"""


def accumulator_onnx() -> onnx.ModelProto:
    """OUTPUT = OUTPUT_STATE = INPUT + INPUT_STATE (the state lives in the server), controls echoed."""
    i32, u64 = TensorProto.INT32, TensorProto.UINT64

    def vi(name: str, elem: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", 1])

    nodes = [
        helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT_STATE"]),
        helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"]),
        helper.make_node("Identity", ["START"], ["START_OUT"]),
        helper.make_node("Identity", ["END"], ["END_OUT"]),
        helper.make_node("Identity", ["READY"], ["READY_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "accumulator",
        [
            vi("INPUT", i32),
            vi("INPUT_STATE", i32),
            vi("START", i32),
            vi("END", i32),
            vi("READY", i32),
            vi("CORRID", u64),
        ],
        [vi(n, i32) for n in ("OUTPUT", "OUTPUT_STATE", "START_OUT", "END_OUT", "READY_OUT")] + [vi("CORRID_OUT", u64)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def onnx_config(name: str, strategy: str, state: str, idle_us: int = 5_000_000, count: int = 2) -> str:
    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
        f"sequence_batching {{\n  max_sequence_idle_microseconds: {idle_us}\n  {strategy}\n{CONTROLS}\n  {state}\n}}\n"
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"{OUTPUTS}\ninstance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    )


ZERO_STATE = (
    'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] '
    'initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]'
)
DEFAULT_STATE = 'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ -1 ] } ]'

PY_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Accumulates INPUT into an implicit state; reports what the sequence batcher handed it."""

    def execute(self, requests):
        ready_sum = sum(int(pb_utils.get_input_tensor_by_name(r, "READY").as_numpy().sum()) for r in requests)
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(r, "INPUT_STATE").as_numpy()
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy()
            total = (x + np.where(start, 0, state)).astype(np.int32)
            info = json.dumps({"corrid": r.correlation_id(), "flags": r.flags(), "corrid_tensor": corrid.reshape(-1)[0].decode()})
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total),
                pb_utils.Tensor("OUTPUT_STATE", total),
                pb_utils.Tensor("ROWS", np.array([[len(requests)]], dtype=np.int32)),
                pb_utils.Tensor("READY_SUM", np.array([[ready_sum]], dtype=np.int32)),
                pb_utils.Tensor("INFO", np.array([[info.encode()]], dtype=np.object_)),
            ]))
        return responses
'''
PY_CONFIG = """
name: "pyacc"
backend: "python"
max_batch_size: 2
sequence_batching {
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _write(repo: Path, name: str, config: str, files: dict[str, bytes]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    for filename, data in files.items():
        (repo / name / "1" / filename).write_bytes(data)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequence") / "repo"
    acc = accumulator_onnx().SerializeToString()
    _write(repo, "acc_direct", onnx_config("acc_direct", "direct { }", ZERO_STATE), {"model.onnx": acc})
    oldest = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 2000 }"
    _write(repo, "acc_oldest", onnx_config("acc_oldest", oldest, DEFAULT_STATE), {"model.onnx": acc})
    # one instance of batch 2: two slots, so a third sequence waits in the backlog
    _write(
        repo,
        "acc_small",
        onnx_config("acc_small", "direct { }", ZERO_STATE, count=1).replace("max_batch_size: 4", "max_batch_size: 2"),
        {"model.onnx": acc},
    )
    _write(
        repo,
        "acc_idle",
        onnx_config("acc_idle", "direct { }", ZERO_STATE, idle_us=300_000, count=1),
        {"model.onnx": acc},
    )
    # one slot (one instance, max_batch_size 1) and a 1 s idle limit: the backlog-expiry test's model
    _write(
        repo,
        "acc_backlog",
        onnx_config("acc_backlog", "direct { }", ZERO_STATE, idle_us=1_000_000, count=1).replace(
            "max_batch_size: 4", "max_batch_size: 1"
        ),
        {"model.onnx": acc},
    )
    _write(repo, "pyacc", PY_CONFIG, {"model.py": PY_MODEL.encode()})
    # one instance of 4 slots that waits (up to 2 s) until every slot has a request: batches of 4
    wait_direct = "direct { max_queue_delay_microseconds: 2000000 minimum_slot_utilization: 1.0 }"
    _write(
        repo, "acc_direct_wait", onnx_config("acc_direct_wait", wait_direct, ZERO_STATE, count=1), {"model.onnx": acc}
    )
    wait_oldest = (
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000000 }"
    )
    _write(
        repo,
        "acc_oldest_wait",
        onnx_config("acc_oldest_wait", wait_oldest, DEFAULT_STATE, count=1),
        {"model.onnx": acc},
    )
    server = start_server(repo)
    yield server
    server.terminate()


def _client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, concurrency=8)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _mod(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _step(
    client: Any, protocol: str, model: str, value: int, sid: int | str, start: bool = False, end: bool = False
) -> Any:
    mod = _mod(protocol)
    inp = mod.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/v2/models/{model}/stats").json()["model_stats"][0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
def test_interleaved_sequences_keep_their_own_state_step_by_step(
    server: ServerProcess, protocol: str, model: str
) -> None:
    client = _client(server, protocol)
    base = 1000 if protocol == "http" else 2000
    # uint64 ids, one of them above 2**63 where JSON allows it (tritonclient's gRPC sends int64_param)
    ids = [base + 1, base + 2, (1 << 63) + base if protocol == "http" else base + 3]
    values = {sid: [k * 10 + i for i in range(1, 6)] for k, sid in enumerate(ids, 1)}
    totals = dict.fromkeys(ids, 0)
    steps = len(next(iter(values.values())))
    for i in range(steps):
        for sid in ids:  # interleaved: each sequence advances one step per round
            result = _step(client, protocol, model, values[sid][i], sid, start=i == 0, end=i == steps - 1)
            totals[sid] += values[sid][i]
            assert result.as_numpy("OUTPUT").tolist() == [[totals[sid]]], (sid, i)
            assert result.as_numpy("START_OUT").tolist() == [[1 if i == 0 else 0]]
            assert result.as_numpy("END_OUT").tolist() == [[1 if i == steps - 1 else 0]]
            assert result.as_numpy("READY_OUT").tolist() == [[1]]
            assert result.as_numpy("CORRID_OUT").tolist() == [[sid]]
            # the state tensor itself is not an output the config lists: it never reaches the client
            assert result.as_numpy("OUTPUT_STATE") is None


def _run_sequences(server: ServerProcess, model: str, count: int, steps: int, base: int) -> list[list[int]]:
    def run(k: int) -> list[int]:
        protocol = "http" if k % 2 else "grpc"
        client = _client(server, protocol)
        out, total = [], 0
        for i in range(steps):
            total += k + i
            result = _step(client, protocol, model, k + i, base + k, start=i == 0, end=i == steps - 1)
            out.append(int(result.as_numpy("OUTPUT")[0, 0]))
            assert out[-1] == total, (base + k, i, out)
        return out

    with ThreadPoolExecutor(count) as pool:
        results = list(pool.map(run, range(count)))
    for k, out in enumerate(results):
        assert out == list(np.cumsum([k + i for i in range(steps)]))
    return results


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
def test_concurrent_sequences_keep_their_state(server: ServerProcess, model: str) -> None:
    """Eight sequences at once over both protocols on 2 instances x 4 slots: every step's sum is right."""
    before = _stats(server, model)
    _run_sequences(server, model, 8, 6, 5000 if model == "acc_direct" else 5100)
    assert _stats(server, model)["inference_count"] - before["inference_count"] == 48


@pytest.mark.parametrize("model", ["acc_direct_wait", "acc_oldest_wait"])
def test_concurrent_sequences_share_batches(server: ServerProcess, model: str) -> None:
    """Four sequences on one instance of 4 slots whose batcher waits for all four: batches of 4 rows,
    each row with its own sequence's state."""
    before = _stats(server, model)
    _run_sequences(server, model, 4, 5, 6000 if model == "acc_direct_wait" else 6100)
    after = _stats(server, model)
    assert after["inference_count"] - before["inference_count"] == 20
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sizes.get(4, 0) >= 1, sizes
    assert after["execution_count"] - before["execution_count"] < 20


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_errors(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    with pytest.raises(
        InferenceServerException,
        match="inference request for sequence 777 to model 'acc_direct' must specify the START flag on the first request of the sequence",
    ):
        _step(client, protocol, "acc_direct", 1, 777)
    mod = _mod(protocol)
    inp = mod.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(
        InferenceServerException,
        match="inference request to model 'acc_direct' must specify a non-zero or non-empty correlation ID",
    ):
        client.infer("acc_direct", [inp])
    two = mod.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(
        InferenceServerException,
        match="inference request to model 'acc_direct' must specify batch-size 1 due to requirements of sequence batcher",
    ):
        client.infer("acc_direct", [two], sequence_id=778, sequence_start=True)
    # a request that ended its sequence frees the id: continuing it again is an error
    _step(client, protocol, "acc_direct", 1, 779, start=True, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _step(client, protocol, "acc_direct", 1, 779)


def test_backlog_waits_for_a_free_slot(server: ServerProcess) -> None:
    """acc_small has 2 slots: a third sequence's first request waits until one of the two ends."""
    client = _client(server, "grpc")
    _step(client, "grpc", "acc_small", 1, 1, start=True)
    _step(client, "grpc", "acc_small", 2, 2, start=True)
    waiting: Future[Any]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_step, _client(server, "grpc"), "grpc", "acc_small", 5, 3, True)
        metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"

        def backlog() -> bool:
            text = httpx.get(metrics).text
            return 'nv_inference_pending_request_count{model="acc_small",version="1"} 1.0' in text

        wait_for("the third sequence to wait in the backlog", backlog)
        assert not waiting.done()
        # sequence 1 and 2 go on with their own state while 3 waits
        assert _step(client, "grpc", "acc_small", 10, 1).as_numpy("OUTPUT").tolist() == [[11]]
        assert not waiting.done()
        assert _step(client, "grpc", "acc_small", 1, 1, end=True).as_numpy("OUTPUT").tolist() == [[12]]
        # sequence 1 ended: its slot goes to sequence 3, which starts from the initial (zero) state
        assert waiting.result(60).as_numpy("OUTPUT").tolist() == [[5]]
        assert _step(client, "grpc", "acc_small", 5, 3, end=True).as_numpy("OUTPUT").tolist() == [[10]]
        assert _step(client, "grpc", "acc_small", 20, 2, end=True).as_numpy("OUTPUT").tolist() == [[22]]


def _pending(server: ServerProcess, model: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).text
    prefix = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    return float(next(line for line in text.splitlines() if line.startswith(prefix))[len(prefix) :])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_backlogged_sequence_whose_client_left_is_dropped_after_the_idle_time(
    server: ServerProcess, protocol: str
) -> None:
    """Issue 23: a sequence waiting in the backlog whose client went away used to wait there (its request
    and tensors with it) for as long as live sequences held the slots. Now it is dropped once it has been
    idle for max_sequence_idle_microseconds (1 s here) — the pending-request count says so, its id is
    unknown again — while a backlogged sequence whose client still waits keeps waiting, as in Triton."""
    model = "acc_backlog"
    keep, gone, live = (900, 901, 902) if protocol == "http" else (910, 911, 912)
    client = _client(server, "grpc")
    steps = [1]
    _step(client, "grpc", model, 1, keep, start=True)
    stop = threading.Event()

    def keep_alive() -> None:  # holds the only slot: a step every 0.1 s, far inside the 1 s idle limit
        while not stop.wait(0.1):
            _step(client, "grpc", model, 1, keep)
            steps.append(1)

    keeper = threading.Thread(target=keep_alive)
    keeper.start()
    try:
        mark = len(server.log())
        if protocol == "http":  # the client gives up (its connection closes) while START waits
            body = {
                "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [7]}],
                "parameters": {"sequence_id": gone, "sequence_start": True},
            }
            with pytest.raises(httpx.TimeoutException):
                httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=body, timeout=0.5)
        else:  # the client's deadline passes while START waits
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[7]], dtype=np.int32))
            with pytest.raises(InferenceServerException, match="Deadline"):
                client.infer(model, [inp], sequence_id=gone, sequence_start=True, client_timeout=0.5)
        wait_for("the abandoned sequence to be dropped from the backlog", lambda: _pending(server, model) == 0, 15)
        assert f"sequence {gone} of model '{model}' waited in the backlog with no client left" in server.log()[mark:]
        with pytest.raises(
            InferenceServerException, match=f"sequence {gone} to model '{model}' must specify the START"
        ):
            _step(client, "grpc", model, 1, gone)
        # a client that still waits is never dropped, however long it waits
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_step, _client(server, protocol), protocol, model, 5, live, True)
            wait_for("the live sequence to wait in the backlog", lambda: _pending(server, model) == 1)
            stop.wait(2.5)  # more than twice the idle limit
            assert not waiting.done()
            # the live sequence still waits (a keeper step in flight may count once more at any instant)
            wait_for("the live sequence to be still in the backlog", lambda: _pending(server, model) == 1, 5)
            assert not waiting.done()
            stop.set()
            keeper.join()
            # the kept sequence never lost its slot (its state counted every step); its END frees the slot
            assert _step(client, "grpc", model, 1, keep, end=True).as_numpy("OUTPUT").tolist() == [[len(steps) + 1]]
            assert waiting.result(60).as_numpy("OUTPUT").tolist() == [[5]]
        assert _step(client, "grpc", model, 1, live, end=True).as_numpy("OUTPUT").tolist() == [[6]]
    finally:
        stop.set()
        keeper.join()


def test_idle_sequence_is_released_with_triton_error(server: ServerProcess) -> None:
    client = _client(server, "http")
    assert _step(client, "http", "acc_idle", 3, 42, start=True).as_numpy("OUTPUT").tolist() == [[3]]
    wait_for(
        "the idle sequence to be released (max_sequence_idle_microseconds 300000)",
        lambda: "sequence 42 of model 'acc_idle' was idle for more than 300000 us" in server.log(),
    )
    with pytest.raises(
        InferenceServerException,
        match="inference request for sequence 42 to model 'acc_idle' must specify the START flag",
    ):
        _step(client, "http", "acc_idle", 1, 42)
    # a new START with the same id begins a fresh sequence with fresh state
    assert _step(client, "http", "acc_idle", 4, 42, start=True, end=True).as_numpy("OUTPUT").tolist() == [[4]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_python_model_with_string_ids_and_implicit_state(server: ServerProcess, protocol: str) -> None:
    import json

    client = _client(server, protocol)
    ids = [f"{protocol}-alpha", f"{protocol}-beta-δ"]
    totals = dict.fromkeys(ids, 0)
    for i in range(4):
        for sid in ids:
            value = i + (1 if sid.endswith("alpha") else 100)
            result = _step(client, protocol, "pyacc", value, sid, start=i == 0, end=i == 3)
            totals[sid] += value
            assert result.as_numpy("OUTPUT").tolist() == [[totals[sid]]]
            info = json.loads(result.as_numpy("INFO")[0, 0])
            assert info["corrid"] == sid and info["corrid_tensor"] == sid
            assert info["flags"] == (1 if i == 0 else 0) | (2 if i == 3 else 0)


def test_direct_strategy_keeps_rows_per_slot(server: ServerProcess) -> None:
    """pyacc: 2 slots. With sequence A ended, B (slot 1) runs with a filler row in slot 0: READY false."""
    client = _client(server, "grpc")
    a, b = "rows-a", "rows-b"
    first = _step(client, "grpc", "pyacc", 1, a, start=True)
    assert first.as_numpy("ROWS").tolist() == [[1]]  # slot 0 is the highest row used
    _step(client, "grpc", "pyacc", 1, b, start=True)
    _step(client, "grpc", "pyacc", 1, a, end=True)
    lonely = _step(client, "grpc", "pyacc", 5, b)
    assert lonely.as_numpy("OUTPUT").tolist() == [[6]]
    assert lonely.as_numpy("ROWS").tolist() == [[2]]
    assert lonely.as_numpy("READY_SUM").tolist() == [[1]]
    before = _stats(server, "pyacc")
    _step(client, "grpc", "pyacc", 1, b, end=True)
    after = _stats(server, "pyacc")
    # the filler row executed but is not an inference anybody asked for
    assert after["inference_count"] - before["inference_count"] == 1


def test_sequence_parameters_are_validated(server: ServerProcess) -> None:
    body = {
        "parameters": {"sequence_id": 1.5, "sequence_start": True},
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
    }
    r = httpx.post(f"{server.base_url}/v2/models/acc_direct/infer", json=body)
    assert r.status_code == 400
    assert "Unable to parse 'sequence_id'" in r.json()["error"]


def test_steps_sent_back_to_back_on_a_grpc_stream_run_in_order(server: ServerProcess) -> None:
    """Triton's way to stream a sequence: no waiting between steps; each still sees the previous state."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        results.append(error if error is not None else result)
        if len(results) == 5:
            done.set()

    client.start_stream(callback)
    try:
        for i in range(5):
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[i + 1]], dtype=np.int32))
            client.async_stream_infer("acc_direct", [inp], sequence_id=9090, sequence_start=i == 0, sequence_end=i == 4)
        assert done.wait(60), results
    finally:
        client.stop_stream()
    assert all(not isinstance(r, Exception) for r in results), results
    assert sorted(int(r.as_numpy("OUTPUT")[0, 0]) for r in results) == [1, 3, 6, 10, 15]
