"""``model_operations { op_library_filename }``: ONNX models with custom operators (Triton's "Custom Operations").

One real server in explicit mode; the library is a real one, onnxruntime-extensions' (its operators live in
the ``ai.onnx.contrib`` domain; the model here uses ``StringUpper``). Where a library may come from: a file
name in the model's folder, or an absolute path outside the repository (the server image), or into the
model's own folder. Everything else is refused on load with a 400 naming ``op_library_filename`` and why,
the model is UNAVAILABLE with that reason, and the good model keeps serving.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from onnxruntime_extensions import get_library_path
from tritonclient.utils import InferenceServerException

from tests.support.models import unary
from tests.support.server import ServerProcess, start_server

LIBRARY = "libortextensions.so"
UPPER_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 2 ] } ]
%s
"""


def _upper_model() -> bytes:
    """OUT = StringUpper(IN), an onnxruntime-extensions operator ONNX Runtime does not have itself."""
    graph = helper.make_graph(
        [helper.make_node("StringUpper", ["IN"], ["OUT"], domain="ai.onnx.contrib")],
        "upper",
        [helper.make_tensor_value_info("IN", TensorProto.STRING, ["batch", 2])],
        [helper.make_tensor_value_info("OUT", TensorProto.STRING, ["batch", 2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    )
    model.ir_version = 8
    return model.SerializeToString()


def _operations(*libraries: str | Path) -> str:
    return "model_operations { " + " ".join(f"op_library_filename: {json.dumps(str(x))}" for x in libraries) + " }"


def _write_upper(repo: Path, name: str, *libraries: str | Path, with_library: bool = True) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(UPPER_CONFIG % (_operations(*libraries) if libraries else "")))
    (folder / "1" / "model.onnx").write_bytes(_upper_model())
    if with_library:
        shutil.copy(get_library_path(), folder / LIBRARY)
    return folder


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("customops")
    outside = base / "outside"
    outside.mkdir()
    shutil.copy(get_library_path(), outside / LIBRARY)
    repo = base / "repo"
    repo.mkdir()
    good = repo / "good"
    (good / "1").mkdir(parents=True)
    (good / "1" / "model.onnx").write_bytes(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]).SerializeToString())
    _write_upper(repo, "upper", LIBRARY)
    return {"base": base, "repo": repo, "outside": outside}


@pytest.fixture(scope="module")
def server(layout: dict[str, Path]) -> Iterator[ServerProcess]:
    s = start_server(layout["repo"], "--model-control-mode", "explicit", "--load-model", "good")
    yield s
    assert s.terminate() == 0


def _load(server: ServerProcess, name: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v2/repository/models/{name}/load", json={}, timeout=120)


def _upper(server: ServerProcess, name: str) -> list[list[bytes]]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        data = np.array([[b"hello", b"Custom ops"], [b"abc", b""]], dtype=np.object_)
        inp = httpclient.InferInput("IN", [2, 2], "BYTES")
        inp.set_data_from_numpy(data)
        result = client.infer(name, [inp]).as_numpy("OUT")
    finally:
        client.close()
    assert result is not None
    return result.tolist()


def _still_serving(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [-1.0, 2.0, -3.0, 4.0]}]}
    r = httpx.post(f"{server.base_url}/v2/models/good/infer", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [0.0, 2.0, 0.0, 4.0], r.text


def _index_reason(server: ServerProcess, name: str) -> list[dict]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=30).json()
    return [row for row in rows if row["name"] == name]


UPPERED = [[b"HELLO", b"CUSTOM OPS"], [b"ABC", b""]]


def test_a_library_named_in_the_model_folder_serves_its_operators(server: ServerProcess) -> None:
    r = _load(server, "upper")
    assert r.status_code == 200, r.text
    assert _upper(server, "upper") == UPPERED
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inp = grpcclient.InferInput("IN", [1, 2], "BYTES")
        inp.set_data_from_numpy(np.array([[b"grpc", b"too"]], dtype=np.object_))
        assert client.infer("upper", [inp]).as_numpy("OUT").tolist() == [[b"GRPC", b"TOO"]]


def test_an_absolute_library_outside_the_repository_serves(server: ServerProcess, layout: dict[str, Path]) -> None:
    """Triton's usual form: a library shipped in the image, by absolute path (here: the installed package's)."""
    _write_upper(layout["repo"], "upper-absolute", get_library_path(), with_library=False)
    r = _load(server, "upper-absolute")
    assert r.status_code == 200, r.text
    assert _upper(server, "upper-absolute") == UPPERED


def test_an_absolute_path_into_the_models_own_folder_serves(server: ServerProcess, layout: dict[str, Path]) -> None:
    """What Triton users write (Triton resolves relative names against its working directory)."""
    folder = layout["repo"] / "upper-own"
    _write_upper(layout["repo"], "upper-own", folder / LIBRARY)
    r = _load(server, "upper-own")
    assert r.status_code == 200, r.text
    assert _upper(server, "upper-own") == UPPERED


def test_a_custom_op_without_its_library_says_what_to_configure(server: ServerProcess, layout: dict[str, Path]) -> None:
    _write_upper(layout["repo"], "upper-nolib", with_library=False)
    r = _load(server, "upper-nolib")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "StringUpper" in error and "model_operations { op_library_filename" in error, error
    _still_serving(server)


def _bad_case(layout: dict[str, Path], case: str) -> tuple[str, str]:
    """Writes a model for ``case``; returns its name and the words its refusal must carry."""
    repo, outside = layout["repo"], layout["outside"]
    name = f"bad-{case}"
    if case == "missing":
        _write_upper(repo, name, "libmissing.so")
        return name, "'libmissing.so': no such file in the model's folder"
    if case == "missing_absolute":
        _write_upper(repo, name, outside / "libmissing.so", with_library=False)
        return name, "no such file on the server"
    if case == "dotdot":
        _write_upper(repo, name, f"../upper/{LIBRARY}")
        return name, "contains a path separator"
    if case == "parent":
        _write_upper(repo, name, "..")
        return name, "starts with '.'"
    if case == "subfolder":
        folder = _write_upper(repo, name, f"1/{LIBRARY}")
        shutil.copy(get_library_path(), folder / "1" / LIBRARY)
        return name, "contains a path separator"
    if case == "symlink_out":
        folder = _write_upper(repo, name, LIBRARY)
        (folder / LIBRARY).unlink()
        os.symlink(outside / LIBRARY, folder / LIBRARY)
        return name, "leads outside the model's folder through a symlink"
    if case == "symlink_to_another_model":
        folder = _write_upper(repo, name, LIBRARY)
        (folder / LIBRARY).unlink()
        os.symlink(f"../upper/{LIBRARY}", folder / LIBRARY)
        return name, "leads outside the model's folder through a symlink"
    if case == "absolute_into_repository":
        _write_upper(repo, name, repo / "upper" / LIBRARY, with_library=False)
        return name, "leads into the model repository outside this model's folder"
    if case == "absolute_symlink_into_repository":
        link = outside / "into-repo.so"
        if not link.exists():
            os.symlink(repo / "upper" / LIBRARY, link)
        _write_upper(repo, name, link, with_library=False)
        return name, "leads into the model repository outside this model's folder"
    if case == "not_a_library":
        folder = _write_upper(repo, name, "notalib.so")
        (folder / "notalib.so").write_text("this is not a shared library\n")
        return name, "'notalib.so': onnxruntime cannot load"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "missing_absolute",
        "dotdot",
        "parent",
        "subfolder",
        "symlink_out",
        "symlink_to_another_model",
        "absolute_into_repository",
        "absolute_symlink_into_repository",
        "not_a_library",
    ],
)
def test_libraries_that_cannot_be_used_are_refused_with_the_reason(
    server: ServerProcess, layout: dict[str, Path], case: str
) -> None:
    name, words = _bad_case(layout, case)
    r = _load(server, name)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "op_library_filename" in error and words in error, error
    rows = _index_reason(server, name)
    assert rows and all(row["state"] == "UNAVAILABLE" for row in rows), rows
    assert any(words in row["reason"] for row in rows), rows
    _still_serving(server)


@pytest.mark.parametrize(
    ("library", "problem"),
    [("../upper/" + LIBRARY, "contains a path separator"), (".hidden.so", "starts with '.'"), ("", "is empty")],
)
def test_library_names_in_a_load_override_are_refused(server: ServerProcess, library: str, problem: str) -> None:
    """The load API's config override goes through the same rule (HTTP and gRPC)."""
    config = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "input": [{"name": "IN", "data_type": "TYPE_STRING", "dims": [2]}],
        "output": [{"name": "OUT", "data_type": "TYPE_STRING", "dims": [2]}],
        "model_operations": {"op_library_filename": [library]},
    }
    override = json.dumps(config)
    r = httpx.post(
        f"{server.base_url}/v2/repository/models/upper/load", json={"parameters": {"config": override}}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert "op_library_filename" in r.json()["error"] and problem in r.json()["error"], r.text
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("upper", config=override)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "op_library_filename" in info.value.message() and problem in info.value.message()
    _still_serving(server)


PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def test_other_backends_ignore_the_field_with_a_warning(server: ServerProcess, layout: dict[str, Path]) -> None:
    """As Triton: only its onnxruntime backend reads model_operations (TensorRT/PyTorch custom ops are LD_PRELOADed)."""
    folder = layout["repo"] / "echo"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(PYTHON_MODEL)
    (folder / "config.pbtxt").write_text(
        textwrap.dedent("""
        backend: "python"
        max_batch_size: 4
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
        model_operations { op_library_filename: "libnot-here.so" }
        """)
    )
    r = _load(server, "echo")
    assert r.status_code == 200, r.text
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]}
    r = httpx.post(f"{server.base_url}/v2/models/echo/infer", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.5, 2.5], r.text
    warnings = [line for line in server.log().splitlines() if "model 'echo'" in line and "op_library_filename" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert "ignored for backend 'python'" in warnings[0], warnings


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server for a pool shared by teams: op libraries only from the model's own folder."""
    repo = tmp_path_factory.mktemp("strict") / "repo"
    good = repo / "good"
    (good / "1").mkdir(parents=True)
    (good / "1" / "model.onnx").write_bytes(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]).SerializeToString())
    _write_upper(repo, "upper", LIBRARY)
    _write_upper(repo, "upper-own", repo / "upper-own" / LIBRARY)
    _write_upper(repo, "upper-image", get_library_path(), with_library=False)
    flags = ["--model-control-mode", "explicit", "--load-model", "good", "--allow-external-op-libraries=false"]
    s = start_server(repo, *flags)
    yield s
    assert s.terminate() == 0


def test_a_server_can_refuse_libraries_from_outside_the_model_folder(strict_server: ServerProcess) -> None:
    """Issue 23: Triton loads an op library from any absolute path; with --allow-external-op-libraries=false
    a model may only load a library it ships in its own folder. The refusal names the entry and the flag,
    on both protocols; the model's own libraries (by name or by absolute path) still load."""
    for name in ("upper", "upper-own"):
        r = _load(strict_server, name)
        assert r.status_code == 200, r.text
        assert _upper(strict_server, name) == UPPERED
    r = _load(strict_server, "upper-image")
    assert r.status_code == 400, r.text
    expected = f"model_operations op_library_filename '{get_library_path()}' is outside the model's folder"
    assert expected in r.json()["error"] and "--allow-external-op-libraries=false" in r.json()["error"], r.text
    (row,) = _index_reason(strict_server, "upper-image")
    assert row["state"] == "UNAVAILABLE" and expected in row["reason"], row
    with grpcclient.InferenceServerClient(strict_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("upper-image")
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and expected in info.value.message()
    _still_serving(strict_server)


def test_the_flag_is_in_the_help() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kubeinfer.server", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--allow-external-op-libraries" in done.stdout
