"""Decoupled Python models streamed over gRPC with tritonclient, as Triton 2.51 streams them.

The models (tests/support/python_models) are Triton-style and were run unchanged on Triton 2.51 to
record what a client sees; the expectations below are those observations: every response's
``triton_final_response``, empty finals on request, error texts of misused response senders, the
``triton_grpc_error`` header closing the stream with the error's status.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, grpc_transports
from tests.support.waiting import wait_for


@pytest.fixture(scope="module", params=grpc_transports())
def server(request: pytest.FixtureRequest, python_models_server_on: Callable[[str], ServerProcess]) -> ServerProcess:
    """Every test runs on each gRPC transport (--grpc-transport)."""
    return python_models_server_on(str(request.param))


class Stream:
    """A tritonclient gRPC stream collecting (result, error) pairs."""

    def __init__(self, server: ServerProcess, headers: dict[str, str] | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.items.put((result, error)), headers=headers)

    def send(self, model: str, inputs: list[Any], request_id: str = "", **kw: Any) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, **kw)

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


def _tensor(name: str, values: list[Any], datatype: str) -> grpcclient.InferInput:
    dtype = {"INT32": np.int32, "UINT32": np.uint32, "FP32": np.float32}.get(datatype, np.object_)
    array = np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=dtype)
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def repeat(values: list[int], delays: list[int], wait: int = 0) -> list[grpcclient.InferInput]:
    return [_tensor("IN", values, "INT32"), _tensor("DELAY", delays, "UINT32"), _tensor("WAIT", [wait], "UINT32")]


def mode(value: str) -> list[grpcclient.InferInput]:
    return [_tensor("MODE", [value], "BYTES")]


def final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def out(result: Any, name: str = "OUT") -> Any:
    value = result.as_numpy(name)
    return None if value is None else value.tolist()


def test_repeat_streams_each_response_as_it_is_sent_interleaving_requests(stream: Stream, tmp_path: Path) -> None:
    """Responses come from the model's own threads after execute returned, in send order across requests:
    "slow" holds its first response at a gate the test opens only once "fast" has sent both of its."""
    stream.send("repeat_int32", repeat([1, 2, 3], [10, 10, 10]), "slow", parameters={"gate": str(tmp_path)})
    stream.send("repeat_int32", repeat([7, 8], [10, 10]), "fast")
    items = stream.take(2)
    (tmp_path / "open").touch()
    items += stream.take(3)
    assert all(error is None for _, error in items), items
    seen = [(r.get_response().id, out(r)[0], out(r, "IDX")[0], final(r)) for r, _ in items]
    assert [s for s in seen if s[0] == "slow"] == [("slow", 1, 0, False), ("slow", 2, 1, False), ("slow", 3, 2, False)]
    assert [s for s in seen if s[0] == "fast"] == [("fast", 7, 0, False), ("fast", 8, 1, False)]
    assert [s[0] for s in seen[:2]] == ["fast", "fast"]  # the fast request finished before the slow one's first
    assert stream.nothing_more()  # the flag-only finals are not sent unless asked for


def test_square_marks_the_last_response_final(stream: Stream) -> None:
    stream.send("square_int32", [_tensor("IN", [3], "INT32")], "sq")
    items = stream.take(3)
    assert [(out(r), final(r)) for r, _ in items] == [([3], False), ([3], False), ([3], True)]
    assert {r.get_response().model_name for r, _ in items} == {"square_int32"}
    assert {r.get_response().model_version for r, _ in items} == {"1"}


def test_empty_final_response_only_when_the_client_asks(stream: Stream) -> None:
    stream.send("square_int32", [_tensor("IN", [0], "INT32")], "zero", enable_empty_final_response=True)
    stream.send("repeat_int32", repeat([5], [0]), "rep", enable_empty_final_response=True)
    items = {}
    for result, error in stream.take(3):
        assert error is None
        items.setdefault(result.get_response().id, []).append(result)
    (empty,) = items["zero"]
    response = empty.get_response()
    assert final(empty) and not response.outputs
    # as Triton: the empty final names the model and the version the request asked for ("")
    assert (response.model_name, response.model_version) == ("square_int32", "")
    assert [(out(r), final(r)) for r in items["rep"]] == [([5], False), (None, True)]


def test_non_decoupled_models_answer_in_request_order_with_final_flags(stream: Stream) -> None:
    stream.send("cancellable", [_tensor("SECONDS", [0.3], "FP32")], "slow")
    stream.send("error_code", [_tensor("CODE", ["INVALID_ARG"], "BYTES")], "bad")
    stream.send("error_code", [_tensor("CODE", ["OK"], "BYTES")], "ok")
    (slow, e1), (bad, e2), (ok, e3) = stream.take(3)
    assert e1 is None and slow.get_response().id == "slow" and final(slow)
    assert bad is None and e2.message() == "error code: INVALID_ARG"
    assert e3 is None and out(ok) == [b"ok"] and final(ok)


def test_async_execute_of_a_decoupled_model_serves_requests_concurrently(stream: Stream, tmp_path: Path) -> None:
    """One instance; the second request's coroutine runs while the first's still waits (at a gate the test
    opens only once the second has answered)."""
    stream.send("async_decoupled", [_tensor("IN", [3, 10], "INT32")], "slow", parameters={"gate": str(tmp_path)})
    stream.send("async_decoupled", [_tensor("IN", [3, 10], "INT32")], "fast")
    order = [r.get_response().id for r, _ in stream.take(3)]
    (tmp_path / "open").touch()
    order += [r.get_response().id for r, _ in stream.take(3)]
    assert order == ["fast"] * 3 + ["slow"] * 3, order


def test_an_error_response_does_not_end_the_stream(stream: Stream) -> None:
    stream.send("decoupled_misuse", mode("ERROR_RESPONSE"), "e")
    (r1, e1), (r2, e2) = stream.take(2)
    assert r1 is None and e1.message() == "bad token"
    assert e2 is None and out(r2) == [b"after the error"] and not final(r2)


def test_triton_grpc_error_header_closes_the_stream_with_the_status(server: ServerProcess) -> None:
    s = Stream(server, headers={"triton_grpc_error": "true"})
    try:
        s.send("error_code", [_tensor("CODE", ["OK"], "BYTES")], "1")
        s.send("error_code", [_tensor("CODE", ["NOT_FOUND"], "BYTES")], "2")
        (ok, e1), (_, e2) = s.take(2)
        assert e1 is None and out(ok) == [b"ok"]
        assert e2.status() == "StatusCode.NOT_FOUND" and e2.message() == "error code: NOT_FOUND"
        with pytest.raises(InferenceServerException):  # the stream is closed
            s.send("error_code", [_tensor("CODE", ["OK"], "BYTES")], "3")
    finally:
        s.client.close()


def test_triton_grpc_error_with_a_decoupled_model(server: ServerProcess) -> None:
    s = Stream(server, headers={"triton_grpc_error": "true"})
    try:
        s.send("decoupled_misuse", mode("ERROR_RESPONSE"), "e")
        ((_, error),) = s.take(1)
        assert error.status() == "StatusCode.INVALID_ARGUMENT" and error.message() == "bad token"
        assert s.nothing_more()
    finally:
        s.client.close()


def test_requests_refused_before_they_run_are_errors_in_the_stream(stream: Stream) -> None:
    stream.send("no_such_model", [_tensor("IN", [1], "INT32")], "u")
    stream.send("square_int32", [_tensor("IN", [1], "INT32")], "after")
    items = stream.take(2)
    errors = [e.message() for _, e in items if e is not None]
    assert errors == ["Request for unknown model: 'no_such_model' is not found"]
    assert [out(r) for r, e in items if e is None] == [[1]]


# ---- Triton's response-sender rules (python_backend response_sender.cc), messages as Triton 2.51 ----


def _last_error(stream: Stream) -> str:
    stream.send("decoupled_misuse", mode("LAST_ERROR"), "last")
    ((result, error),) = stream.take(1)
    assert error is None
    return str(out(result)[0].decode())


def test_decoupled_execute_must_return_none(stream: Stream) -> None:
    stream.send("decoupled_misuse", mode("RETURN_RESPONSES"), "r")
    ((_, error),) = stream.take(1)
    assert error.message() == (
        "Failed to process the request(s) for model 'decoupled_misuse_0', message: Python model "
        "'decoupled_misuse_0' is using the decoupled mode and the execute function must return None."
    )


def test_decoupled_exception_after_a_response(stream: Stream) -> None:
    stream.send("decoupled_misuse", mode("RAISE_AFTER_SEND"), "r")
    (first, e1), (_, e2) = stream.take(2)
    assert e1 is None and out(first) == [b"first"] and not final(first)
    assert e2.message().startswith(
        "Failed to process the request(s) for model 'decoupled_misuse_0', message: ValueError: raised after one "
        "response\n\nAt:\n  "
    )
    assert e2.message().endswith("/decoupled_misuse/1/model.py(22): execute\n")


@pytest.mark.parametrize(
    ("misuse", "message"),
    [
        ("SEND_AFTER_FINAL", "TritonModelException: Unable to send response. Response sender has been closed."),
        ("BAD_FLAGS", "TritonModelException: Unable to send response. Unsupported flag provided."),
        (
            "NO_RESPONSE_NO_FLAGS",
            "TritonModelException: Inference Response object must be provided when the response flags is set to zero.",
        ),
    ],
)
def test_response_sender_refusals(stream: Stream, misuse: str, message: str) -> None:
    stream.send("decoupled_misuse", mode(misuse), misuse)
    if misuse == "SEND_AFTER_FINAL":
        ((result, error),) = stream.take(1)
        assert error is None and out(result) == [b"only"] and final(result)
    assert stream.nothing_more(0.3)
    assert _last_error(stream) == message


def _sender_misuse(client: Any, module: Any, value: str) -> Any:
    t = module.InferInput("MODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return client.infer("sender_misuse", [t]).as_numpy("OUT")[0].decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_decoupled_response_senders(server: ServerProcess, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    assert _sender_misuse(client, module, "ONE") == "one"
    assert _sender_misuse(client, module, "LATE") == "late"  # sent from a thread after execute returned
    assert _sender_misuse(client, module, "TWO") == "first"
    assert _sender_misuse(client, module, "LAST_ERROR") == (
        "TritonModelException: Unable to send response. Non-decoupled model cannot send more than one response."
    )
    assert _sender_misuse(client, module, "FINAL_ONLY") == "answered after the refused final"
    assert _sender_misuse(client, module, "LAST_ERROR") == (
        "TritonModelException: Unable to send response. Non-decoupled model cannot send complete final before "
        "sending a response."
    )
    assert _sender_misuse(client, module, "RETURN_TOO") == "sent"  # the sent answer stands


def test_one_response_calls_to_a_decoupled_model_get_tritons_errors(server: ServerProcess) -> None:
    h = httpclient.InferenceServerClient(server.http_url)
    t = httpclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([2], np.int32))
    with pytest.raises(InferenceServerException) as info:
        h.infer("square_int32", [t])
    assert info.value.status() == "501"
    assert info.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    g = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as ginfo:
        g.infer("square_int32", [_tensor("IN", [2], "INT32")])
    assert ginfo.value.status() == "StatusCode.UNIMPLEMENTED"
    assert ginfo.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


def test_statistics_count_streamed_requests(server: ServerProcess, stream: Stream) -> None:
    h = httpclient.InferenceServerClient(server.http_url)

    def successes() -> int:
        return int(h.get_inference_statistics("square_int32")["model_stats"][0]["inference_stats"]["success"]["count"])

    before = successes()
    for i in range(3):
        stream.send("square_int32", [_tensor("IN", [1], "INT32")], f"s{i}")
    stream.take(3)
    wait_for("three more successes of square_int32", lambda: successes() == before + 3)
