"""Python-backend behaviour where Triton 2.51 is looser than a strict reading of the config, and where it
runs work concurrently (issue 26): outputs handed over as execute returned them, response senders in a
non-decoupled model before and after execute returns, several BLS calls of one execute at once.

The models are tests/support/python_parity; each test runs them in stub processes and in the server's
process (``KUBEINFER_IN_PROCESS``), over HTTP and gRPC. The expected answers are what Triton 2.51
answered with the same models: set ``KUBEINFER_PARITY_TRITON=1`` and these tests run against real Triton
(the ``tritonserver`` of ``benchmarks/peers``' nvidia-pytriton virtualenv) instead of kubeinfer.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import start_server
from tests.support.waiting import wait_for

MODELS = Path(__file__).parents[1] / "support" / "python_parity"
IN_PROCESS = 'parameters { key: "KUBEINFER_IN_PROCESS" value: { string_value: "true" } }\n'
ASYNC = 'parameters { key: "ASYNC" value: { string_value: "true" } }\n'
TRITON = os.environ.get("KUBEINFER_PARITY_TRITON") == "1"

# sender_paths' PATH values (model.py)
RETURN, PRE, PRE_FINAL, POST, POST_FINAL, TWO_PRE, FINAL_FIRST, PRE_AND_RETURN, RETURN_AND_POST = range(9)


def _variant(repo: Path, source: str, name: str, extra: str = "", replace: tuple[str, str] = ("", "")) -> None:
    shutil.copytree(MODELS / source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = (repo / name / "config.pbtxt").read_text()
    if replace[0]:
        config = config.replace(*replace)
    (repo / name / "config.pbtxt").write_text(config + extra)


def _repository(repo: Path, sources: list[str]) -> Path:
    """Each model twice: ``<name>`` in stub processes, ``<name>_inproc`` in the server's process; and
    sender_paths with an async execute, bls_fanout in its three modes."""
    repo.mkdir(parents=True)
    for place, extra in (("", ""), ("_inproc", IN_PROCESS)):
        if "loose_outputs" in sources:
            _variant(repo, "loose_outputs", f"loose_outputs{place}", extra)
        if "sender_paths" in sources:
            _variant(repo, "sender_paths", f"sender_paths{place}", extra)
            _variant(repo, "sender_paths", f"sender_paths_async{place}", extra + ASYNC)
        if "bls_fanout" in sources:
            _variant(repo, "bls_fanout", f"bls_fanout{place}", extra)
            # one request per execute, as Triton's ConcurrencyTest model: the executes overlap instead
            batching = "dynamic_batching { max_queue_delay_microseconds: 300000 }"
            _variant(repo, "bls_fanout", f"bls_fanout_unbatched{place}", extra, (batching, ""))
            for mode in ("gather", "threads"):
                _variant(
                    repo,
                    "bls_fanout",
                    f"bls_fanout_{mode}{place}",
                    extra,
                    (
                        'decoupled: true }\nparameters { key: "MODE" value: { string_value: "async" } }',
                        f'decoupled: false }}\nparameters {{ key: "MODE" value: {{ string_value: "{mode}" }} }}',
                    ),
                )
    if "bls_fanout" in sources:
        _variant(repo, "bls_sleeper", "bls_sleeper")
    return repo


@dataclass
class _Triton:
    """Real Triton 2.51 in place of ``ServerProcess`` (KUBEINFER_PARITY_TRITON=1)."""

    peer: Any

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.peer.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.peer.grpc_port}"

    def log(self) -> str:
        return Path(self.peer.log).read_text(errors="replace")

    def terminate(self, timeout: float = 60) -> int:
        self.peer.proc.terminate()
        return int(self.peer.proc.wait(timeout))


def _serve(repo: Path) -> Any:
    if not TRITON:
        return start_server(repo, log_dir=repo.parent)
    sys.path.insert(0, str(Path(__file__).parents[2]))
    from benchmarks.peers import peers

    triton = _Triton(peers.start_triton(repo, repo.parent))
    client = httpclient.InferenceServerClient(triton.http_url)
    wait_for("triton ready", lambda: _ready(client), 120, describe=triton.log)
    return triton


def _ready(client: httpclient.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_ready())
    except Exception:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repo = _repository(tmp_path_factory.mktemp("parity") / "repo", ["loose_outputs", "sender_paths"])
    server = _serve(repo)
    yield server
    server.terminate()


PLACES = ["", "_inproc"]


# ---- outputs: what execute returned, as Triton's python backend hands it over -------------------------
def _mode(value: str, module: Any) -> Any:
    t = module.InferInput("MODE", [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return t


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_keep_the_datatype_and_shape_execute_returned(server: Any, protocol: str, place: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    model = f"loose_outputs{place}"
    expected = {
        "INT64": ("INT64", [1, 2], np.array([[7, 8]], np.int64)),  # the config says INT32
        "RANK1": ("INT32", [1], np.array([5], np.int32)),  # the config says [-1, -1]
        "FP32": ("FP32", [1, 1, 1], np.array([[[1.5]]], np.float32)),
    }
    for mode, (datatype, shape, values) in expected.items():
        result = client.infer(model, [_mode(mode, module)])
        output = result.get_output("OUT")
        got_type = output["datatype"] if protocol == "http" else output.datatype
        got_shape = output["shape"] if protocol == "http" else list(output.shape)
        assert (got_type, got_shape) == (datatype, shape), mode
        np.testing.assert_array_equal(result.as_numpy("OUT"), values)
        assert result.as_numpy("OUT").dtype == values.dtype


@pytest.mark.parametrize("place", PLACES)
def test_an_output_the_config_does_not_name_is_left_out(server: Any, place: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer(f"loose_outputs{place}", [_mode("EXTRA", httpclient)])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUT"]
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([[1, 2]], np.int32))
    with pytest.raises(InferenceServerException, match="unexpected inference output 'EXTRA'"):
        client.infer(
            f"loose_outputs{place}", [_mode("EXTRA", httpclient)], outputs=[httpclient.InferRequestedOutput("EXTRA")]
        )


# ---- response senders in a non-decoupled model ----------------------------------------------------------
def _path_input(path: int, module: Any) -> Any:
    t = module.InferInput("PATH", [1, 1], "INT32")
    t.set_data_from_numpy(np.array([[path]], np.int32))
    return t


def _stream(server: Any, model: str, paths: list[int]) -> list[tuple[Any, Any]]:
    """gRPC ModelStreamInfer: ``paths`` as requests on one stream; every (result, error) that came back,
    waiting for one per request and then a while for any more (a request must answer exactly once)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        for path in paths:
            client.async_stream_infer(model, [_path_input(path, grpcclient)])
        try:
            got = [answers.get(timeout=30) for _ in paths]
        except queue.Empty:
            pytest.fail(f"{model}: fewer than {len(paths)} answers to {paths} within 30 s")
        time.sleep(1.0)  # past the model's later sends (0.3 s after execute returned)
    finally:
        client.stop_stream()
        client.close()
    return got + [answers.get() for _ in range(answers.qsize())]


def _codes(answers: list[tuple[Any, Any]]) -> list[int]:
    assert [error for _, error in answers if error is not None] == []
    return sorted(int(result.as_numpy("OUT")[0][0]) for result, _ in answers)


def _http(server: Any, model: str, path: int) -> int:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30, connection_timeout=30)
    try:
        return int(client.infer(model, [_path_input(path, httpclient)]).as_numpy("OUT")[0][0])
    finally:
        client.close()


def _grpc(server: Any, model: str, path: int) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return int(client.infer(model, [_path_input(path, grpcclient)], client_timeout=30).as_numpy("OUT")[0][0])
    finally:
        client.close()


SENDERS = [f"sender_paths{kind}{place}" for kind in ("", "_async") for place in PLACES]


@pytest.mark.parametrize("model", SENDERS)
def test_each_request_answers_once_along_its_path_over_grpc(server: Any, model: str) -> None:
    # returned; sent before execute returns (with or without the final flag apart); sent after it returned
    for path, code in [(RETURN, 100), (PRE, 200), (PRE_FINAL, 201), (POST, 300), (POST_FINAL, 301)]:
        assert _codes(_stream(server, model, [path])) == [code], path
    assert _grpc(server, model, POST) == 300  # ModelInfer too


@pytest.mark.parametrize("model", SENDERS)
def test_requests_sharing_one_execute_answer_along_their_own_paths(server: Any, model: str) -> None:
    paths = [RETURN, PRE, PRE_FINAL, POST, POST_FINAL]
    assert _codes(_stream(server, model, paths)) == [100, 200, 201, 300, 301]
    with ThreadPoolExecutor(len(paths)) as pool:
        assert list(pool.map(lambda p: _http(server, model, p), paths)) == [100, 200, 201, 300, 301]


@pytest.mark.parametrize("model", SENDERS)
def test_a_response_sent_first_stands_when_the_model_then_breaks_the_senders_rules(server: Any, model: str) -> None:
    # a second response raises in execute; a response returned for a request already answered is refused;
    # a send after the returned response raises in the model's thread: the client sees the first answer
    assert _codes(_stream(server, model, [TWO_PRE])) == [210]
    assert _codes(_stream(server, model, [PRE_AND_RETURN])) == [220]
    assert _codes(_stream(server, model, [RETURN_AND_POST])) == [130]
    if not TRITON:  # Triton 2.51 answers HTTP status 500 with the first response as its body
        assert _http(server, model, TWO_PRE) == 210
    assert _http(server, model, RETURN_AND_POST) == 130
    assert _http(server, model, PRE_AND_RETURN) == 220
    assert _grpc(server, model, RETURN_AND_POST) == 130
    assert _grpc(server, model, PRE_AND_RETURN) == 220


@pytest.mark.parametrize("model", SENDERS)
def test_a_final_flag_before_any_response_fails_the_request_with_tritons_text(server: Any, model: str) -> None:
    answers = _stream(server, model, [FINAL_FIRST])
    assert len(answers) == 1 and answers[0][0] is None
    assert "Non-decoupled model cannot send complete final before sending a response" in answers[0][1].message()
    with pytest.raises(InferenceServerException, match="cannot send complete final before sending a response"):
        _http(server, model, FINAL_FIRST)
    assert _http(server, model, RETURN) == 100  # and the model serves on


# ---- several BLS calls of one execute at once ------------------------------------------------------------
WAIT = 3.0


@pytest.fixture(scope="module")
def bls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repo = _repository(tmp_path_factory.mktemp("parity_bls") / "repo", ["bls_fanout"])
    server = _serve(repo)
    yield server
    server.terminate()


def _waits(module: Any) -> Any:
    t = module.InferInput("WAIT_SECONDS", [1, 1], "FP32")
    t.set_data_from_numpy(np.full([1, 1], WAIT, np.float32))
    return t


def _timed(run: Callable[[], list[Any]]) -> tuple[float, list[Any]]:
    start = time.monotonic()
    results = run()
    return time.monotonic() - start, results


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("model", ["bls_fanout", "bls_fanout_unbatched"])
def test_bls_calls_of_a_decoupled_async_model_run_at_once(bls_server: Any, model: str, place: str) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(bls_server.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:

        def four() -> list[Any]:
            for _ in range(4):
                client.async_stream_infer(f"{model}{place}", [_waits(grpcclient)])
            return [answers.get(timeout=4 * WAIT + 30) for _ in range(4)]

        took, results = _timed(four)
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in results] == [None] * 4
    assert [r.as_numpy("DUMMY_OUT").tolist() for r, _ in results] == [[[0.0]]] * 4
    assert took < 2 * WAIT, f"4 BLS calls of {WAIT} s took {took:.1f} s: they ran one after another"


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("mode", ["gather", "threads"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_calls_of_one_multi_request_execute_run_at_once(
    bls_server: Any, mode: str, place: str, protocol: str
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient

    def call(_: int) -> Any:
        client = module.InferenceServerClient(bls_server.http_url if protocol == "http" else bls_server.grpc_url)
        try:
            return client.infer(f"bls_fanout_{mode}{place}", [_waits(module)]).as_numpy("DUMMY_OUT").tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(4) as pool:
        took, results = _timed(lambda: list(pool.map(call, range(4))))
    assert results == [[[0.0]]] * 4
    assert took < 2 * WAIT, f"4 BLS calls of {WAIT} s took {took:.1f} s: they ran one after another"


def test_the_server_stops_promptly_after_concurrent_bls(bls_server: Any) -> None:
    # runs after the tests above: the BLS calls they made leave nothing that keeps the process alive
    start = time.monotonic()
    code = bls_server.terminate(timeout=30)
    assert time.monotonic() - start < 30
    assert code == 0, bls_server.log()[-4000:]
