"""Ensembles on a real server: the CIFAR pipeline end to end (HTTP and gRPC), readiness that follows
the members, a diamond graph whose branches run concurrently and whose join batches with outside traffic."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.repos import copy_example_repository
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CIFAR_CLASSES = {b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"}
IMAGE_SHAPES = [(32, 32), (57, 41), (1, 1), (240, 320)]


def _image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    return rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8)


def _infer(client, module, model: str, name: str, array: np.ndarray, datatype: str, output: str) -> np.ndarray:
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return client.infer(model, [inp], outputs=[module.InferRequestedOutput(output)]).as_numpy(output)


@pytest.fixture(scope="module")
def pipeline_server(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The example repository served with HTTP and gRPC."""
    server = start_server(example_repository, log_dir=tmp_path_factory.mktemp("pipeline"))
    yield server
    server.terminate()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cifar_pipeline_equals_the_three_steps_by_hand(pipeline_server: ServerProcess, protocol: str) -> None:
    if protocol == "http":
        module, client = httpclient, httpclient.InferenceServerClient(pipeline_server.http_url)
    else:
        module, client = grpcclient, grpcclient.InferenceServerClient(pipeline_server.grpc_url)
    rng = np.random.default_rng(5)
    for h, w in IMAGE_SHAPES:
        image = _image(rng, h, w)
        label = _infer(client, module, "cifar10_pipeline", "IMAGE", image, "UINT8", "CLASS")
        assert label.shape == (1, 1) and label.dtype == np.object_
        pre = _infer(client, module, "preprocessor", "IMAGE", image, "UINT8", "INPUT")
        assert pre.shape == (1, 3, 32, 32) and pre.dtype == np.float32
        logits = _infer(client, module, "cifar10_resnet", "input", pre, "FP32", "output")
        by_hand = _infer(client, module, "postprocessor", "LOGITS", logits, "FP32", "CLASS")
        assert label[0, 0] == by_hand[0, 0]
        assert label[0, 0] in CIFAR_CLASSES
    config = client.get_model_config("cifar10_pipeline")
    config = config if protocol == "http" else config.config
    assert (config["platform"] if protocol == "http" else config.platform) == "ensemble"


def test_pipeline_rejects_a_wrong_image(pipeline_server: ServerProcess) -> None:
    bad = np.zeros((1, 8, 8, 4), dtype=np.uint8)  # 4 channels: the ensemble's own config refuses it
    response = httpx.post(
        f"{pipeline_server.base_url}/v2/models/cifar10_pipeline/infer",
        json={
            "inputs": [{"name": "IMAGE", "datatype": "UINT8", "shape": list(bad.shape), "data": bad.ravel().tolist()}]
        },
    )
    assert response.status_code == 400
    assert "IMAGE" in response.json()["error"]


def test_pipeline_readiness_follows_its_members(example_repository: Path, tmp_path: Path) -> None:
    server = start_server(
        example_repository,
        "--model-control-mode=explicit",
        "--load-model=cifar10_pipeline",
        "--load-model=preprocessor",
        "--load-model=postprocessor",
        log_dir=tmp_path,
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("cifar10_pipeline")
        image = _image(np.random.default_rng(0), 32, 32)
        with pytest.raises(InferenceServerException) as info:
            _infer(client, httpclient, "cifar10_pipeline", "IMAGE", image, "UINT8", "CLASS")
        assert info.value.status() == "503"
        assert "cifar10_resnet" in info.value.message()

        client.load_model("cifar10_resnet")
        assert client.is_model_ready("cifar10_pipeline")
        label = _infer(client, httpclient, "cifar10_pipeline", "IMAGE", image, "UINT8", "CLASS")
        assert label[0, 0] in CIFAR_CLASSES

        client.unload_model("cifar10_resnet")
        wait_for("the pipeline not ready", lambda: not client.is_model_ready("cifar10_pipeline"))
    finally:
        server.terminate()


# ---- the diamond: IN → (branch_a, branch_b, which meet at a rendezvous) → join -----------------------------

BRANCH = """
import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Y = X * scale, once the other branch has reached the same request: a branch waits at a rendezvous
    (marker files counted per model), so the diamond can only answer if both branches run at the same time.\"\"\"

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config["parameters"]
        self.name = config["name"]
        self.rendezvous = Path(params["rendezvous"]["string_value"])
        self.peer = params["peer"]["string_value"]
        self.scale = float(params["scale"]["string_value"])
        self.seen = 0

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        if any(np.isnan(x).any() for x in xs):
            raise ValueError("X contains NaN")
        for _ in requests:
            self.seen += 1
            (self.rendezvous / f"{self.name}-{self.seen}").touch()
        deadline = time.monotonic() + 60
        while not (self.rendezvous / f"{self.peer}-{self.seen}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.peer} never ran while {self.name} waited: the branches ran one by one")
            time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * self.scale).astype(np.float32))]) for x in xs]
"""

JOIN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SUM = A + B; REQUESTS = how many requests shared this execute call (shows batching)."""

    def execute(self, requests):
        responses = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            n = np.full((a.shape[0], 1), len(requests), dtype=np.int32)
            outputs = [pb_utils.Tensor("SUM", a + b), pb_utils.Tensor("REQUESTS", n)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
'''


def _python_model(repo: Path, name: str, config: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (repo / name / "1" / "model.py").write_text(source)


def _branch_config(name: str, peer: str, scale: float, rendezvous: Path) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        dynamic_batching {{ max_queue_delay_microseconds: 100000 }}
        parameters {{ key: "rendezvous" value: {{ string_value: "{rendezvous}" }} }}
        parameters {{ key: "peer" value: {{ string_value: "{peer}" }} }}
        parameters {{ key: "scale" value: {{ string_value: "{scale}" }} }}
    """


def _join_config(name: str, batching: str) -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [
          {{ name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }},
          {{ name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }}
        ]
        {batching}
    """


def _diamond_config(name: str, join: str) -> str:
    return f"""
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [
          {{ name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }},
          {{ name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }}
        ]
        ensemble_scheduling {{
          step [
            {{ model_name: "branch_a" model_version: -1 input_map {{ key: "X" value: "IN" }}
               output_map {{ key: "Y" value: "a" }} }},
            {{ model_name: "branch_b" model_version: 1 input_map {{ key: "X" value: "IN" }}
               output_map {{ key: "Y" value: "b" }} }},
            {{ model_name: "{join}" input_map [ {{ key: "A" value: "a" }}, {{ key: "B" value: "b" }} ]
               output_map [ {{ key: "SUM" value: "SUM" }}, {{ key: "REQUESTS" value: "REQUESTS" }} ] }}
          ]
        }}
    """


@pytest.fixture(scope="module")
def diamond_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("diamond") / "repo"
    rendezvous = repo.parent / "rendezvous"
    rendezvous.mkdir()
    _python_model(repo, "branch_a", _branch_config("branch_a", "branch_b", 2.0, rendezvous), BRANCH)
    _python_model(repo, "branch_b", _branch_config("branch_b", "branch_a", 3.0, rendezvous), BRANCH)
    _python_model(repo, "join", _join_config("join", ""), JOIN)
    # a full batch of 2 dispatches at once; a lone request waits (an hour) for company
    batched = "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 3600000000 }"
    _python_model(repo, "join_batched", _join_config("join_batched", batched), JOIN)
    for name, join in (("diamond", "join"), ("diamond_batched", "join_batched")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(_diamond_config(name, join)))
    server = start_server(repo, log_dir=repo.parent)
    yield server
    server.terminate()


def _ensemble_input(x: np.ndarray, module=httpclient) -> list:
    inp = module.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_diamond_branches_run_concurrently(diamond_server: ServerProcess, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    url = diamond_server.http_url if protocol == "http" else diamond_server.grpc_url
    client = module.InferenceServerClient(url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    # each branch waits for the other to reach the request: run one after the other, they would fail
    result = client.infer("diamond", _ensemble_input(x, module))
    np.testing.assert_allclose(result.as_numpy("SUM"), 5 * x)


def test_ensemble_returns_only_the_requested_outputs(diamond_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(diamond_server.http_url)
    x = np.ones((1, 4), dtype=np.float32)
    result = client.infer("diamond", _ensemble_input(x), outputs=[httpclient.InferRequestedOutput("SUM")])
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["SUM"]
    np.testing.assert_allclose(result.as_numpy("SUM"), 5 * x)


def test_ensemble_step_error_names_the_step(diamond_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(diamond_server.http_url)
    x = np.full((1, 4), np.nan, dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("diamond", _ensemble_input(x))
    message = info.value.message()
    assert info.value.status() == "500"
    assert "ensemble 'diamond' step" in message and "X contains NaN" in message
    assert "branch_a" in message or "branch_b" in message
    # the server keeps serving
    ok = client.infer("diamond", _ensemble_input(np.ones((1, 4), dtype=np.float32)))
    np.testing.assert_allclose(ok.as_numpy("SUM"), 5.0)


def test_ensemble_step_batches_with_outside_traffic(diamond_server: ServerProcess) -> None:
    """A direct request to join_batched waits for company and executes in one batch with the ensemble's step."""
    url = diamond_server.http_url

    # each client is closed on the thread that made it: tritonclient's gevent pool cannot be joined from
    # another thread (an unraisable AttributeError in __del__ when the main thread collects it)
    def direct() -> np.ndarray:
        with httpclient.InferenceServerClient(url, network_timeout=60) as client:
            inputs = [httpclient.InferInput("A", [1, 4], "FP32"), httpclient.InferInput("B", [1, 4], "FP32")]
            inputs[0].set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            inputs[1].set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            return client.infer("join_batched", inputs).as_numpy("REQUESTS")

    def through_ensemble() -> np.ndarray:
        with httpclient.InferenceServerClient(url, network_timeout=60) as client:
            one = _ensemble_input(np.ones((1, 4), dtype=np.float32))
            return client.infer("diamond_batched", one).as_numpy("REQUESTS")

    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(direct)
        b = pool.submit(through_ensemble)
        direct_requests, ensemble_requests = a.result(timeout=60), b.result(timeout=60)
    assert direct_requests[0, 0] == 2 and ensemble_requests[0, 0] == 2
    stats = httpclient.InferenceServerClient(url).get_inference_statistics("join_batched")["model_stats"][0]
    assert stats["execution_count"] < stats["inference_count"]
    assert (stats["execution_count"], stats["inference_count"]) == (1, 2)


def test_ensemble_refuses_unknown_member_at_request_time(tmp_path: Path) -> None:
    repo = copy_example_repository(tmp_path / "repo")
    (repo / "broken_pipeline" / "1").mkdir(parents=True)
    (repo / "broken_pipeline" / "config.pbtxt").write_text(
        textwrap.dedent("""
        name: "broken_pipeline"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
        ensemble_scheduling { step [ { model_name: "no_such_model" model_version: -1
          input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
    """)
    )
    server = start_server(repo, log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("broken_pipeline")
        inp = httpclient.InferInput("IN", [1, 16], "FP32")
        inp.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("broken_pipeline", [inp])
        assert info.value.status() == "503"
        assert "no_such_model" in info.value.message()
        assert client.is_model_ready("cifar10_pipeline")
    finally:
        server.terminate()
