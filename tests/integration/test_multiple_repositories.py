"""Several model repositories (``--model-repository`` repeated), as Triton serves them (real server processes).

Models are merged across the repositories; a model found in more than one is not served (Triton's poll
logs ``failed to poll model '<name>': not unique across all model repositories``; its index row is
UNAVAILABLE, ``model appears in two or more repositories``) while the others serve. Client checks ported
from Triton's qa/L0_lifecycle (test_multiple_model_repository_polling/_control, test_model_repository_index).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support.models import unary
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

DUPLICATE = "model appears in two or more repositories"

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""

ENSEMBLE = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "relu" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "r" } },
    { model_name: "neg" model_version: -1 input_map { key: "IN" value: "r" } output_map { key: "OUT" value: "OUT" } }
  ]
}
"""

WHERE_CONFIG = """
name: "where"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

WHERE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.repository = args["model_repository"]

    def execute(self, requests):
        out = np.array([self.repository.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""

OPS = {"relu": "Relu", "neg": "Neg", "dup": "Abs", "late": "Relu"}


def put_model(repo: Path, name: str) -> None:
    """Built under a dot-name, renamed into place (as the operator publishes)."""
    repo.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repo))
    (staging / "config.pbtxt").write_text(CONFIG.format(name=name))
    (staging / "1").mkdir()
    model = unary(name, OPS[name], TensorProto.FLOAT, ["batch", 4])
    (staging / "1" / "model.onnx").write_bytes(model.SerializeToString())
    os.rename(staging, repo / name)


def remove_model(repo: Path, name: str) -> None:
    doomed = repo / f".{name}.removing-{os.getpid()}"
    os.rename(repo / name, doomed)
    shutil.rmtree(doomed)


def infer(url: str, name: str, x: np.ndarray, module=httpclient) -> np.ndarray:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(url)
    inp = module.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(name, [inp]).as_numpy("OUT")


def http_index(server: ServerProcess) -> list[dict]:
    return httpclient.InferenceServerClient(server.http_url).get_model_repository_index()


X = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def two_repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path, Path]]:
    root = tmp_path_factory.mktemp("multi")
    first, second = root / "first", root / "second"
    put_model(first, "relu")
    put_model(first, "dup")
    (first / "chain" / "1").mkdir(parents=True)
    (first / "chain" / "config.pbtxt").write_text(ENSEMBLE)
    put_model(second, "neg")
    put_model(second, "dup")
    (second / "where" / "1").mkdir(parents=True)
    (second / "where" / "config.pbtxt").write_text(WHERE_CONFIG)
    (second / "where" / "1" / "model.py").write_text(textwrap.dedent(WHERE_MODEL))
    server = start_server(first, f"--model-repository={second}", log_dir=root)
    yield server, first, second
    server.terminate()


def test_models_of_both_repositories_serve(two_repos: tuple[ServerProcess, Path, Path]) -> None:
    server, _, _ = two_repos
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        np.testing.assert_allclose(infer(url, "relu", X, module), np.maximum(X, 0))
        np.testing.assert_allclose(infer(url, "neg", X, module), -X)
        # the ensemble's steps live in different repositories
        np.testing.assert_allclose(infer(url, "chain", X, module), -np.maximum(X, 0))
        client = module.InferenceServerClient(url)
        assert client.is_server_live()
        assert client.is_model_ready("relu") and client.is_model_ready("neg") and client.is_model_ready("chain")


def test_a_python_model_is_given_its_own_repository(two_repos: tuple[ServerProcess, Path, Path]) -> None:
    server, _, second = two_repos
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    out = client.infer("where", [inp]).as_numpy("OUT")
    # Triton hands a Python model its folder: <the repository that holds it>/<name>
    assert out[0].decode() == str((second / "where").resolve())


def test_the_index_lists_each_model_once(two_repos: tuple[ServerProcess, Path, Path]) -> None:
    server, _, _ = two_repos
    expected = ["chain", "dup", "neg", "relu", "where"]
    index = http_index(server)
    assert sorted(row["name"] for row in index) == expected
    dup = next(row for row in index if row["name"] == "dup")
    assert dup["state"] == "UNAVAILABLE" and dup["reason"] == DUPLICATE
    assert all(row["state"] == "READY" for row in index if row["name"] != "dup")
    models = grpcclient.InferenceServerClient(server.grpc_url).get_model_repository_index().models
    assert sorted(m.name for m in models) == expected
    gdup = next(m for m in models if m.name == "dup")
    assert gdup.state == "UNAVAILABLE" and gdup.reason == DUPLICATE


def test_a_model_in_both_repositories_is_not_served(two_repos: tuple[ServerProcess, Path, Path]) -> None:
    server, _, _ = two_repos
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        assert not client.is_model_ready("dup")
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'dup' is not found"):
            infer(url, "dup", X, module)
    assert "failed to poll model 'dup': not unique across all model repositories" in server.log()


def test_poll_mode_follows_every_repository(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    put_model(first, "relu")
    second.mkdir()
    server = start_server(
        first,
        f"--model-repository={second}",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.2",
        log_dir=tmp_path,
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        put_model(second, "late")  # added to the second repository: loaded by the next poll
        wait_for("late to load from the second repository", lambda: client.is_model_ready("late"))
        np.testing.assert_allclose(infer(server.http_url, "late", X), np.maximum(X, 0))
        # the same name added to the first: not unique any more, unloaded (Triton's poll marks it deleted)
        put_model(first, "late")
        wait_for("late to unload", lambda: not client.is_model_ready("late"))
        late = next(row for row in http_index(server) if row["name"] == "late")
        assert late["state"] == "UNAVAILABLE" and late["reason"] == DUPLICATE
        assert "failed to poll model 'late': not unique across all model repositories" in server.log()
        assert client.is_model_ready("relu")  # the others serve on
        # removed from the second again: unique, loaded from the first
        remove_model(second, "late")
        wait_for("late to load from the first repository", lambda: client.is_model_ready("late"))
        assert [row["name"] for row in http_index(server)].count("late") == 1
        # moved to the other repository between two polls: it serves on from there
        remove_model(first, "late")
        put_model(second, "late")
        wait_for("late to load from the second again", lambda: client.is_model_ready("late"))
        np.testing.assert_allclose(infer(server.http_url, "late", X), np.maximum(X, 0))
    finally:
        server.terminate()


def test_explicit_load_and_unload_across_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    put_model(first, "relu")
    put_model(first, "dup")
    put_model(second, "neg")
    put_model(second, "dup")
    server = start_server(first, f"--model-repository={second}", "--model-control-mode=explicit", log_dir=tmp_path)
    try:
        for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
            client = module.InferenceServerClient(url)
            assert not client.is_model_ready("neg")
            client.load_model("neg")
            assert client.is_model_ready("neg")
            np.testing.assert_allclose(infer(url, "neg", X, module), -X)
            client.unload_model("neg")
            wait_for("neg to unload", lambda c=client: not c.is_model_ready("neg"))
            for name in ("dup", "unknown_model"):
                # Triton: "failed to load '<name>', failed to poll from model repository" (the reason goes to its log)
                with pytest.raises(InferenceServerException) as info:
                    client.load_model(name)
                assert f"failed to load '{name}', failed to poll from model repository" in str(info.value)
            assert not client.is_model_ready("dup")
        assert "failed to poll model 'dup': not unique across all model repositories" in server.log()
        rows = {row["name"]: row for row in http_index(server)}
        assert sorted(rows) == ["dup", "neg", "relu"]
        assert rows["dup"]["reason"] == DUPLICATE
    finally:
        server.terminate()


def test_exit_on_error_stops_on_a_model_in_two_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    put_model(first, "dup")
    put_model(second, "dup")
    put_model(second, "neg")
    server = start_server(first, f"--model-repository={second}", "--exit-on-error=true", log_dir=tmp_path, wait=False)
    try:
        assert server.proc.wait(timeout=60) == 1
        assert f"failed to load dup: {DUPLICATE}" in server.log()
    finally:
        server.terminate()


def test_a_cloud_repository_among_several_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.server",
            "--model-repository=s3://bucket/models",
            f"--model-repository={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "a cloud model repository (s3://, gs://, as://) cannot be combined with other model repositories" in (
        proc.stderr
    )
