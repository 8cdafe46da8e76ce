"""Iterative sequences (``sequence_batching { iterative_sequence: true }``), ported from Triton's
qa/L0_iterative_sequence (iterative_sequence_e2e.py) onto a real server and tritonclient's gRPC stream.

The model (tests/support/iterative_sequence/model.py) is Triton's ``iterative_sequence`` test backend as a
Python model: INPUT n gives n responses counting down to 0, one per execution, the model rescheduling the
request (``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``) until the last.
"""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.server import ServerProcess, start_server

MODEL = Path(__file__).parents[1] / "support" / "iterative_sequence" / "model.py"
RESCHEDULE_ERROR = "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"

CONFIGS = {
    # Triton's qa model config (max_batch_size 4), with the outputs the Python model adds
    "iterative_sequence": ("max_batch_size: 4", True, "sequence_batching { iterative_sequence: true }"),
    # test_backlog_fill's config: one slot, so requests wait in the backlog for it
    "iterative_backlog": (
        "max_batch_size: 1",
        True,
        "sequence_batching { iterative_sequence: true max_sequence_idle_microseconds: 8000000 "
        "direct { max_queue_delay_microseconds: 10000000 } }",
    ),
    "iterative_oldest": (
        "max_batch_size: 4",
        True,
        "sequence_batching { iterative_sequence: true oldest { max_candidate_sequences: 4 } }",
    ),
    "iterative_unbatched": ("max_batch_size: 0", True, "sequence_batching { iterative_sequence: true }"),
    "iterative_not_decoupled": ("max_batch_size: 4", False, "sequence_batching { iterative_sequence: true }"),
    "iterative_in_process": (
        "max_batch_size: 4",
        True,
        "sequence_batching { iterative_sequence: true }\n"
        'parameters { key: "KUBEINFER_IN_PROCESS" value: { string_value: "true" } }',
    ),
    # test_unsupported_sequence_scheduler / test_unsupported_dynamic_scheduler
    "unsupported_direct": ("max_batch_size: 4", True, "sequence_batching { direct {} iterative_sequence: false }"),
    "unsupported_oldest": ("max_batch_size: 4", True, "sequence_batching { oldest {} iterative_sequence: false }"),
    "unsupported_dynamic": ("max_batch_size: 4", True, "dynamic_batching {}"),
}


def _config(name: str, batching: str, decoupled: bool, scheduling: str) -> str:
    dims = "[ 1 ]"
    return f"""name: "{name}"
backend: "python"
{batching}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: {dims} }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: {dims} }},
  {{ name: "FLAGS" data_type: TYPE_INT32 dims: {dims} }},
  {{ name: "CORRID" data_type: TYPE_UINT64 dims: {dims} }}
]
model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}
{scheduling}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("iterative_sequence")
    repo = root / "repo"
    for name, (batching, decoupled, scheduling) in CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(MODEL, repo / name / "1" / "model.py")
        (repo / name / "config.pbtxt").write_text(_config(name, batching, decoupled, scheduling))
    s = start_server(repo, log_dir=root)
    yield s
    s.terminate()


class Stream:
    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.items.put((result, error)))

    def send(self, model: str, value: int, request_id: str = "", batched: bool = True, **kw: Any) -> None:
        array = np.array([[value]] if batched else [value], dtype=np.int32)
        tensor = grpcclient.InferInput("INPUT", list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        self.client.async_stream_infer(model, [tensor], request_id=request_id, **kw)

    def take(self, n: int, timeout: float = 60) -> list[tuple[Any, Any]]:
        return [self.items.get(timeout=timeout) for _ in range(n)]

    def nothing_more(self, wait: float = 0.5) -> bool:
        try:
            self.items.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[Stream]:
    s = Stream(server)
    yield s
    s.close()


def _value(result: Any, name: str = "OUTPUT") -> int:
    return int(result.as_numpy(name).reshape(-1)[0])


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _seen(items: list[tuple[Any, Any]]) -> list[tuple[int, int, bool]]:
    """(OUTPUT, FLAGS, final) of each response; fails on an error."""
    assert all(error is None for _, error in items), [str(e) for _, e in items if e is not None]
    return [(_value(r), _value(r, "FLAGS"), _final(r)) for r, _ in items]


def test_grpc_stream_without_sequence_id_counts_down(stream: Stream) -> None:
    """Triton's test_grpc_stream: no correlation id, no START flag; the request is its own sequence, executed
    once per response: START on the first execution, no flag on the rescheduled ones, final on the last."""
    stream.send("iterative_sequence", 2)
    items = stream.take(2)
    assert _seen(items) == [(1, 1, False), (0, 0, True)]
    corrids = {_value(r, "CORRID") for r, _ in items}
    assert len(corrids) == 1 and 0 not in corrids  # the batcher's own id, the same for every execution
    assert stream.nothing_more()


def test_implicit_sequences_get_their_own_ids(stream: Stream) -> None:
    for i in range(3):
        stream.send("iterative_unbatched", 1, f"r{i}", batched=False)
    items = stream.take(3)
    assert [(v, flags, final) for v, flags, final in _seen(items)] == [(0, 1, True)] * 3
    assert len({_value(r, "CORRID") for r, _ in items}) == 3


def test_explicit_sequence_id_is_kept(stream: Stream) -> None:
    stream.send("iterative_sequence", 3, "seq", sequence_id=77, sequence_start=True)
    items = stream.take(3)
    assert _seen(items) == [(2, 1, False), (1, 0, False), (0, 0, True)]
    assert {_value(r, "CORRID") for r, _ in items} == {77}


def test_concurrent_sequences_are_batched_and_each_counts_down(stream: Stream) -> None:
    for n in (1, 2, 3, 4, 5, 6):
        stream.send("iterative_sequence", n, f"n{n}")
    total = 1 + 2 + 3 + 4 + 5 + 6
    by_id: dict[str, list[tuple[int, bool]]] = {}
    for result, error in stream.take(total):
        assert error is None, str(error)
        by_id.setdefault(result.get_response().id, []).append((_value(result), _final(result)))
    for n in (1, 2, 3, 4, 5, 6):
        assert by_id[f"n{n}"] == [(v, v == 0) for v in range(n - 1, -1, -1)]
    assert stream.nothing_more()


def test_oldest_strategy_reschedules_too(stream: Stream) -> None:
    for n in (2, 3, 4):
        stream.send("iterative_oldest", n, f"o{n}")
    by_id: dict[str, list[int]] = {}
    for result, error in stream.take(2 + 3 + 4):
        assert error is None, str(error)
        by_id.setdefault(result.get_response().id, []).append(_value(result))
    assert by_id == {"o2": [1, 0], "o3": [2, 1, 0], "o4": [3, 2, 1, 0]}


def test_backlog_fill(stream: Stream) -> None:
    """Triton's test_backlog_fill: one slot, four sequences; each waits in the backlog for the slot, which the
    one before frees when it is released without RESCHEDULE."""
    for i in range(4):
        stream.send("iterative_backlog", 2, f"b{i}")
    by_id: dict[str, list[int]] = {}
    for result, error in stream.take(8):
        assert error is None, str(error)
        by_id.setdefault(result.get_response().id, []).append(_value(result))
    assert by_id == {f"b{i}": [1, 0] for i in range(4)}


def test_release_all_ends_the_sequence_and_frees_its_slot(stream: Stream) -> None:
    stream.send("iterative_backlog", 5, "early", parameters={"release_all": True})
    assert _seen(stream.take(1)) == [(4, 1, True)]
    stream.send("iterative_backlog", 2, "next")  # the only slot is free again
    assert [v for v, _, _ in _seen(stream.take(2))] == [1, 0]
    assert stream.nothing_more()


def test_not_decoupled_model_answers_once_after_its_reschedules(server: ServerProcess, stream: Stream) -> None:
    """python_backend's non-decoupled rule: a rescheduled request's entry in execute's list is None."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[3]], dtype=np.int32))
        result = client.infer("iterative_not_decoupled", [tensor])
    assert (_value(result), _value(result, "FLAGS")) == (0, 0)
    stream.send("iterative_not_decoupled", 2)
    assert _seen(stream.take(1)) == [(0, 0, True)]
    assert stream.nothing_more()


def test_in_process_model_reschedules(stream: Stream) -> None:
    stream.send("iterative_in_process", 3)
    assert _seen(stream.take(3)) == [(2, 1, False), (1, 0, False), (0, 0, True)]


@pytest.mark.parametrize("model", ["unsupported_direct", "unsupported_oldest"])
def test_unsupported_sequence_scheduler(stream: Stream, model: str) -> None:
    """Triton's test_unsupported_sequence_scheduler: without iterative_sequence the request cannot be
    rescheduled; the client gets the first response, then the error."""
    stream.send(model, 2, "u", sequence_id=5, sequence_start=True)
    (first, error1), (_, error2) = stream.take(2)
    assert error1 is None and _value(first) == 1
    assert error2 is not None and RESCHEDULE_ERROR in str(error2)


def test_unsupported_dynamic_scheduler(stream: Stream) -> None:
    stream.send("unsupported_dynamic", 2, "d")
    (first, error1), (_, error2) = stream.take(2)
    assert error1 is None and _value(first) == 1
    assert error2 is not None and RESCHEDULE_ERROR in str(error2)


def test_generate_stream(server: ServerProcess) -> None:
    """Triton's test_generate_stream: one server-sent event per execution."""
    r = httpx.post(f"{server.base_url}/v2/models/iterative_sequence/generate_stream", json={"INPUT": 2}, timeout=60)
    assert r.status_code == 200, r.text
    events = [json.loads(chunk.removeprefix("data: ")) for chunk in r.text.split("\n\n") if chunk]
    assert [e["OUTPUT"] for e in events] == [1, 0]
