"""``--model-namespacing=true``: a model is its repository and its name, as Triton (real server processes).

The same name in two repositories is two models, both served; a request by a name that several repositories
hold is refused with Triton's text (model_repository_manager.cc ``FindModelIdentifier``); an ensemble's steps
use the model of the ensemble's own repository, else the only model of that name (``FindNode`` with fuzzy
matching). Client checks ported from Triton's qa/L0_model_namespacing (test_no_duplication, test_duplication,
test_ensemble_duplication, test_dynamic_resolution), with ONNX models in place of its Python ones:
``composing_model`` is Relu in the first repository and Neg in the second.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server import cli
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support.models import unary
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""

ENSEMBLE = """
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "composing_model" model_version: -1
       input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }} }}
  ]
}}
"""

AMBIGUOUS = (
    "There are 2 identifiers of model '{name}' in global map, model namespace must be provided to resolve ambiguity."
)

BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 0
input [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

#: calls the model it is told by name (BLS) and answers its error, or "ok <OUT>"
BLS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            x = pb_utils.Tensor("IN", np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32))
            answer = pb_utils.InferenceRequest(model_name=name, inputs=[x], requested_output_names=["OUT"]).exec()
            if answer.has_error():
                text = answer.error().message()
            else:
                text = "ok " + str(pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy().tolist())
            out = np.array([text.encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

X = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
RELU, NEG, ABS = np.maximum(X, 0), -X, np.abs(X)


def put_model(repo: Path, name: str, op: str) -> None:
    """Built under a dot-name, renamed into place (as the operator publishes)."""
    repo.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repo))
    (staging / "config.pbtxt").write_text(CONFIG.format(name=name))
    (staging / "1").mkdir()
    (staging / "1" / "model.onnx").write_bytes(unary(name, op, TensorProto.FLOAT, ["batch", 4]).SerializeToString())
    os.rename(staging, repo / name)


def put_ensemble(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name))


def layout(root: Path) -> tuple[Path, Path]:
    """Triton's test_duplication and test_ensemble_duplication repositories in one, plus a model found once."""
    first, second = root / "addsub_repo", root / "subadd_repo"
    put_model(first, "composing_model", "Relu")
    put_ensemble(first, "simple_addsub")
    put_ensemble(first, "simple_ensemble")
    put_model(first, "only_here", "Abs")
    put_model(second, "composing_model", "Neg")
    put_ensemble(second, "simple_subadd")
    put_ensemble(second, "simple_ensemble")
    return first, second


def infer(url: str, name: str, module=httpclient) -> np.ndarray:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(url)
    inp = module.InferInput("IN", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    return client.infer(name, [inp]).as_numpy("OUT")


def ambiguous(server: ServerProcess, name: str) -> bool:
    try:
        infer(server.http_url, name)
    except InferenceServerException as exc:
        return AMBIGUOUS.format(name=name) in str(exc.message())
    return False


@pytest.fixture(scope="module")
def namespaced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("namespacing")
    first, second = layout(root)
    (first / "bls" / "1").mkdir(parents=True)
    (first / "bls" / "config.pbtxt").write_text(BLS_CONFIG)
    (first / "bls" / "1" / "model.py").write_text(BLS_MODEL)
    server = start_server(first, f"--model-repository={second}", "--model-namespacing=true", log_dir=root)
    yield server
    server.terminate()


def test_same_name_in_two_repositories_served_apart(namespaced: ServerProcess) -> None:
    for module, url in ((httpclient, namespaced.http_url), (grpcclient, namespaced.grpc_url)):
        client = module.InferenceServerClient(url)
        assert client.is_server_live() and client.is_server_ready()
        # each ensemble uses the composing_model of its own repository
        np.testing.assert_allclose(infer(url, "simple_addsub", module), RELU)
        np.testing.assert_allclose(infer(url, "simple_subadd", module), NEG)
        # a name found once is served as without namespacing
        np.testing.assert_allclose(infer(url, "only_here", module), ABS)


def test_a_request_by_an_ambiguous_name_is_refused(namespaced: ServerProcess) -> None:
    for name in ("composing_model", "simple_ensemble"):
        with pytest.raises(InferenceServerException) as http_error:
            infer(namespaced.http_url, name)
        assert http_error.value.message() == AMBIGUOUS.format(name=name)
        assert http_error.value.status() == "400"
        with pytest.raises(InferenceServerException) as grpc_error:
            infer(namespaced.grpc_url, name, grpcclient)
        assert grpc_error.value.message() == AMBIGUOUS.format(name=name)
        assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert not httpclient.InferenceServerClient(namespaced.http_url).is_model_ready(name)


def test_the_index_lists_the_model_of_each_repository(namespaced: ServerProcess) -> None:
    index = httpclient.InferenceServerClient(namespaced.http_url).get_model_repository_index()
    names = sorted(row["name"] for row in index)
    assert names == [
        "bls",
        "composing_model",
        "composing_model",
        "only_here",
        "simple_addsub",
        "simple_ensemble",
        "simple_ensemble",
        "simple_subadd",
    ]
    assert all(row["state"] == "READY" for row in index)
    models = grpcclient.InferenceServerClient(namespaced.grpc_url).get_model_repository_index().models
    assert sorted(m.name for m in models) == names
    assert "not unique across all model repositories" not in namespaced.log()


def test_ensembles_follow_their_members_as_repositories_change(tmp_path: Path) -> None:
    """Triton's test_dynamic_resolution (poll mode): without its own composing_model an ensemble uses the only
    one left; back in its repository, that one again."""
    first, second = layout(tmp_path)
    server = start_server(
        first,
        f"--model-repository={second}",
        "--model-namespacing=true",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.2",
        log_dir=tmp_path,
    )
    try:
        np.testing.assert_allclose(infer(server.http_url, "simple_addsub"), RELU)
        moved = tmp_path / "composing_model"
        shutil.move(first / "composing_model", moved)

        def unique() -> bool:
            try:
                return bool(np.allclose(infer(server.http_url, "composing_model"), NEG))
            except InferenceServerException:
                return False

        wait_for("composing_model to be unique", unique)
        for name in ("simple_subadd", "simple_addsub", "composing_model"):
            np.testing.assert_allclose(infer(server.http_url, name), NEG)

        staging = first / ".composing_model.back"
        shutil.move(moved, staging)
        os.rename(staging, first / "composing_model")
        wait_for("composing_model to be ambiguous again", lambda: ambiguous(server, "composing_model"))
        wait_for(
            "simple_addsub to use its own repository's composing_model",
            lambda: bool(np.allclose(infer(server.http_url, "simple_addsub"), RELU)),
        )
        np.testing.assert_allclose(infer(server.http_url, "simple_subadd"), NEG)
    finally:
        server.terminate()


def test_explicit_mode_loads_the_model_of_every_repository(tmp_path: Path) -> None:
    """Triton's ModelNamespaceExplicit: a load by name loads that name in every repository holding it."""
    first, second = layout(tmp_path)
    server = start_server(
        first,
        f"--model-repository={second}",
        "--model-namespacing=true",
        "--model-control-mode=explicit",
        log_dir=tmp_path,
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for name in ("composing_model", "simple_addsub", "simple_subadd"):
            client.load_model(name)
        np.testing.assert_allclose(infer(server.http_url, "simple_addsub"), RELU)
        np.testing.assert_allclose(infer(server.http_url, "simple_subadd"), NEG)
        assert ambiguous(server, "composing_model")

        def ready() -> list[str]:
            return sorted(row["name"] for row in client.get_model_repository_index() if row.get("state") == "READY")

        assert ready() == ["composing_model", "composing_model", "simple_addsub", "simple_subadd"]
        client.unload_model("composing_model")  # every repository's
        wait_for("both composing_models to unload", lambda: "composing_model" not in ready())
        assert not client.is_model_ready("simple_addsub")  # its member is gone
    finally:
        server.terminate()


def test_without_namespacing_a_name_in_two_repositories_is_not_served(tmp_path: Path) -> None:
    first, second = layout(tmp_path)
    server = start_server(first, f"--model-repository={second}", "--model-namespacing=false", log_dir=tmp_path)
    try:
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'composing_model' is not found"):
            infer(server.http_url, "composing_model")
        np.testing.assert_allclose(infer(server.http_url, "only_here"), ABS)
    finally:
        server.terminate()


def test_namespacing_with_the_model_cache_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    parser = cli.build_parser(triton=True)
    args = parser.parse_args(
        [f"--model-store={first}", f"--model-store={second}", "--model-namespacing=true", "--model-load-on-demand=true"]
    )
    with pytest.raises(ValueError, match="--model-namespacing=true cannot be combined with the model cache"):
        cli.settings_from_args(args, triton=True)
    args = parser.parse_args([f"--model-store={first}", f"--model-store={second}", "--model-namespacing=true"])
    assert cli.settings_from_args(args, triton=True).model_namespacing
    assert cli.compat_notices(args)[1] == []


def test_bls_names_models_as_a_request_does(namespaced: ServerProcess) -> None:
    """A Python model's BLS request is a request by name (Triton looks it up in its global map, whatever the
    caller's repository): served when the name is found once; when ambiguous, the stub's readiness check
    (TRITONSERVER_ServerModelIsReady: not ready, as GetModel fails) refuses it first, as in Triton."""
    client = httpclient.InferenceServerClient(namespaced.http_url)

    def bls(name: str) -> str:
        inp = httpclient.InferInput("NAME", [1], "BYTES")
        inp.set_data_from_numpy(np.array([name.encode()], dtype=object))
        return str(client.infer("bls", [inp]).as_numpy("OUT")[0].decode())

    assert bls("composing_model").endswith(
        "Failed for execute the inference request. Model 'composing_model' is not ready."
    )
    assert bls("only_here") == "ok [[1.0, 2.0, 3.0, 4.0]]"
