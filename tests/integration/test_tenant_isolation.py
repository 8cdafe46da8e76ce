"""Issue 15 part 1, server side: nothing in a config or a planted symlink makes the server read outside its repository.

One real server in explicit mode. Escapes tried: file names in a load request's config override (HTTP and
gRPC) and in a config.pbtxt on disk (``default_model_filename``, ``label_filename``: '..', absolute,
hidden, separators, control characters, over-long), and symlinks planted in the repository (model
folder, config.pbtxt, version folder, model file, label file) that lead outside it. Each is refused with a
reason naming the field or file; the secret file's text never appears in any answer; the good model keeps
serving; symlinks that stay inside the repository keep working.

Issue 23 ("What was found" 7): a warm-up ``input_data_file`` or a sequence ``initial_state`` ``data_file``
that is a symlink out of the model's folder (to ``/proc/self/environ``, to another tenant's file) makes the
model UNAVAILABLE with the reason, over HTTP and gRPC; the secret never appears in an answer.
"""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support.models import unary
from tests.support.server import ServerProcess, start_server

SECRET = "TOP-SECRET-LINE"
GOOD_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] %s } ]
"""


def _model_bytes() -> bytes:
    return unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]).SerializeToString()


def _write(repo: Path, name: str, extra: str = "", model_file: str = "model.onnx") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(GOOD_CONFIG % extra))
    (folder / "1" / model_file).write_bytes(_model_bytes())
    return folder


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("isolation")
    outside = base / "other-tenant"
    outside.mkdir()
    (outside / "secret.txt").write_text("\n".join(f"{SECRET}-{i}" for i in range(4)) + "\n")
    (outside / "model.onnx").write_bytes(_model_bytes())
    _write(outside, "theirs")
    repo = base / "repo"
    repo.mkdir()
    _write(repo, "good", 'label_filename: "labels.txt"')
    (repo / "good" / "labels.txt").write_text("a\nb\nc\nd\n")
    return {"base": base, "repo": repo, "outside": outside}


@pytest.fixture(scope="module")
def server(layout: dict[str, Path]) -> Iterator[ServerProcess]:
    # the secret is in the server's environment too: /proc/self/environ is what a planted symlink would read
    s = start_server(
        layout["repo"], "--model-control-mode", "explicit", "--load-model", "good", env={"TENANT_SECRET": SECRET}
    )
    yield s
    assert s.terminate() == 0


def _classify(server: ServerProcess, model: str) -> httpx.Response:
    body = {
        "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [4.0, 3.0, 2.0, 1.0]}],
        "outputs": [{"name": "OUT", "parameters": {"classification": 4}}],
    }
    return httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=body, timeout=30)


def _index(server: ServerProcess) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for row in httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=30).json():
        rows.setdefault(row["name"], []).append(row)
    return rows


def _still_serving(server: ServerProcess) -> None:
    r = _classify(server, "good")
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["4.000000:0:a", "3.000000:1:b", "2.000000:2:c", "1.000000:3:d"]


def _override(**fields: object) -> dict:
    config: dict = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": 4,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    label = fields.pop("label_filename", None)
    if label is not None:
        config["output"][0]["label_filename"] = label
    config.update(fields)
    return config


ESCAPING_NAMES = [
    ("../../other-tenant/model.onnx", "contains a path separator"),
    ("/etc/passwd", "contains a path separator"),
    ("..", "starts with '.'"),
    (".hidden.onnx", "starts with '.'"),
    ("a\\b.onnx", "contains a path separator"),
    ("model\n.onnx", "contains a control character"),
    ("m" * 256, "bytes long (at most 255)"),
]


@pytest.mark.parametrize(("filename", "problem"), ESCAPING_NAMES)
@pytest.mark.parametrize("field", ["default_model_filename", "label_filename"])
def test_file_names_in_a_load_override_are_refused(
    server: ServerProcess, grpc_client, field: str, filename: str, problem: str
) -> None:
    override = json.dumps(_override(**{field: filename}))
    r = httpx.post(
        f"{server.base_url}/v2/repository/models/good/load", json={"parameters": {"config": override}}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert field in r.json()["error"] and problem in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model("good", config=override)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert field in info.value.message() and problem in info.value.message()
    _still_serving(server)


def test_a_config_on_disk_naming_a_file_outside_is_unavailable_with_reason(
    server: ServerProcess, layout: dict[str, Path]
) -> None:
    repo = layout["repo"]
    _write(repo, "ondisk", 'label_filename: "../../other-tenant/secret.txt"')
    r = httpx.post(f"{server.base_url}/v2/repository/models/ondisk/load", json={}, timeout=60)
    assert r.status_code == 400 and "label_filename" in r.json()["error"], r.text
    (row,) = _index(server)["ondisk"]
    assert row["state"] == "UNAVAILABLE" and "single file name" in row["reason"]
    assert SECRET not in r.text + json.dumps(row)
    (repo / "ondisk" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\ndefault_model_filename: "/etc/hostname"\n'
    )
    r = httpx.post(f"{server.base_url}/v2/repository/models/ondisk/load", json={}, timeout=60)
    assert r.status_code == 400 and "default_model_filename" in r.json()["error"], r.text
    _still_serving(server)


def _plant(repo: Path, outside: Path, kind: str) -> str:
    """A model whose ``kind`` is a symlink leading out of the repository; returns the model name."""
    name = f"link-{kind.replace('_', '-')}"
    if kind == "model_folder":
        os.symlink(outside / "theirs", repo / name)
        return name
    folder = _write(repo, name, 'label_filename: "labels.txt"')
    (folder / "labels.txt").write_text("a\nb\nc\nd\n")
    if kind == "config":
        (folder / "config.pbtxt").unlink()
        os.symlink(outside / "theirs" / "config.pbtxt", folder / "config.pbtxt")
    elif kind == "version_folder":
        (folder / "1" / "model.onnx").unlink()
        (folder / "1").rmdir()
        os.symlink(outside / "theirs" / "1", folder / "1")
    elif kind == "model_file":
        (folder / "1" / "model.onnx").unlink()
        os.symlink(outside / "model.onnx", folder / "1" / "model.onnx")
    elif kind == "label_file":
        (folder / "labels.txt").unlink()
        os.symlink(outside / "secret.txt", folder / "labels.txt")
    elif kind == "label_file_relative":
        (folder / "labels.txt").unlink()
        os.symlink("../../other-tenant/secret.txt", folder / "labels.txt")
    return name


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("model_folder", "model folder"),
        ("config", "config.pbtxt"),
        ("version_folder", "version folder 1"),
        ("model_file", "version 1 model file"),
        ("label_file", "output 'OUT' label file"),
        ("label_file_relative", "output 'OUT' label file"),
    ],
)
def test_symlinks_leading_out_of_the_repository_are_refused(
    server: ServerProcess, grpc_client, layout: dict[str, Path], kind: str, what: str
) -> None:
    name = _plant(layout["repo"], layout["outside"], kind)
    r = httpx.post(f"{server.base_url}/v2/repository/models/{name}/load", json={}, timeout=60)
    assert r.status_code == 400, r.text
    assert what in r.json()["error"] and "leads outside" in r.json()["error"], r.text
    assert SECRET not in r.text
    rows = _index(server)[name]
    assert all(row["state"] == "UNAVAILABLE" for row in rows), rows
    assert any("leads outside" in row["reason"] for row in rows), rows
    assert not grpc_client.is_model_ready(name)
    r = _classify(server, name)
    # Triton's answer for a model whose load failed: UNAVAILABLE, with the load's reason (never the bytes)
    assert r.status_code == 503 and SECRET not in r.text, r.text
    error = r.json()["error"]
    assert error.startswith(f"Request for unknown model: '{name}' has no available versions: ") and (
        "leads outside" in error
    ), error
    _still_serving(server)


def test_symlinks_inside_the_repository_keep_working(server: ServerProcess, layout: dict[str, Path]) -> None:
    """Sharing files between models of one repository through symlinks stays allowed."""
    repo = layout["repo"]
    shared = repo / ".shared"  # dot-folder: ignored by the repository scan
    shared.mkdir()
    (shared / "relu.onnx").write_bytes(_model_bytes())
    (shared / "labels.txt").write_text("w\nx\ny\nz\n")
    folder = repo / "linked-inside"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(GOOD_CONFIG % 'label_filename: "labels.txt"'))
    os.symlink("../../.shared/relu.onnx", folder / "1" / "model.onnx")
    os.symlink(shared / "labels.txt", folder / "labels.txt")
    r = httpx.post(f"{server.base_url}/v2/repository/models/linked-inside/load", json={}, timeout=60)
    assert r.status_code == 200, r.text
    r = _classify(server, "linked-inside")
    assert r.status_code == 200 and r.json()["outputs"][0]["data"][0] == "4.000000:0:w", r.text


@pytest.mark.parametrize("length", [256, 5000])
def test_over_long_model_names_are_a_400_not_a_500(server: ServerProcess, grpc_client, length: int) -> None:
    name = "m" * length
    for action in ("load", "unload"):
        r = httpx.post(f"{server.base_url}/v2/repository/models/{name}/{action}", json={}, timeout=60)
        assert r.status_code == 400 and "at most 255 bytes" in r.json()["error"], r.text[:300]
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model(name)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "at most 255 bytes" in info.value.message()
    _still_serving(server)


def test_classification_output_only_carries_the_models_own_labels(server: ServerProcess) -> None:
    """The label file is the only thing the server echoes from disk: it is the model folder's own."""
    data = np.array(_classify(server, "good").json()["outputs"][0]["data"])
    assert all(str(x).rsplit(":", 1)[1] in "abcd" for x in data)


def test_load_requests_carrying_model_files_are_refused(server: ServerProcess, grpc_client) -> None:
    """Triton's ``file:<path>`` load parameters would write files into a model folder: not offered here."""
    body = {"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}}
    r = httpx.post(f"{server.base_url}/v2/repository/models/good/load", json=body, timeout=60)
    assert r.status_code == 501 and "file:1/model.onnx" in r.json()["error"], r.text
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model("good", config="{}", files={"file:1/model.onnx": b"AAAA"})
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    _still_serving(server)


def _external_data_model(location: str) -> bytes:
    """``OUT = IN + W`` with the initializer W (4 floats) stored outside the .onnx file, at ``location``."""
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros(4, np.float32), "W")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["IN", "W"], ["OUT"])],
        "external",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["batch", 4])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_onnx_external_data_inside_the_version_folder_is_served(server: ServerProcess, layout: dict[str, Path]) -> None:
    """Large ONNX models keep their weights in files beside model.onnx (ONNX's external data): served."""
    folder = _write(layout["repo"], "external-inside")
    (folder / "1" / "model.onnx").write_bytes(_external_data_model("weights.bin"))
    (folder / "1" / "weights.bin").write_bytes(np.array([1, 2, 3, 4], np.float32).tobytes())
    r = httpx.post(f"{server.base_url}/v2/repository/models/external-inside/load", json={}, timeout=60)
    assert r.status_code == 200, r.text
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [10, 20, 30, 40]}]}
    r = httpx.post(f"{server.base_url}/v2/models/external-inside/infer", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [11, 22, 33, 44], r.text


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink"])
def test_onnx_external_data_outside_the_model_folder_is_refused(
    server: ServerProcess, layout: dict[str, Path], how: str
) -> None:
    """An ONNX file's external-data ``location`` is a path the model author chose: onnxruntime (1.17+) refuses
    one that leads out of the model file's folder, '..', absolute or through a symlink; the load fails with that
    reason and the other tenant's bytes are never read into a model."""
    secret = layout["outside"] / "weights.bin"
    secret.write_bytes(np.array([7, 7, 7, 7], np.float32).tobytes())
    name = f"external-{how}"
    folder = _write(layout["repo"], name)
    location = {"dot-dot": "../../../other-tenant/weights.bin", "absolute": str(secret), "symlink": "w.bin"}[how]
    if how == "symlink":
        os.symlink(secret, folder / "1" / "w.bin")
    (folder / "1" / "model.onnx").write_bytes(_external_data_model(location))
    r = httpx.post(f"{server.base_url}/v2/repository/models/{name}/load", json={}, timeout=60)
    assert r.status_code == 400, r.text
    assert "External data path" in r.json()["error"], r.text
    (row,) = _index(server)[name]
    assert row["state"] == "UNAVAILABLE" and "External data path" in row["reason"], row
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
    r = httpx.post(f"{server.base_url}/v2/models/{name}/infer", json=body, timeout=30)
    assert r.status_code != 200, r.text
    _still_serving(server)


WARMUP_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
model_warmup [ { name: "sample" batch_size: 1
  inputs { key: "IN" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "in.bin" } } } ]
"""

#: a Python sequence model whose output is its implicit state: an initial state read from a file would be echoed
STATE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "STATE").as_numpy())])
            for r in requests
        ]
"""
STATE_CONFIG = """
backend: "python"
max_batch_size: 0
sequence_batching {
  state [ { input_name: "STATE" output_name: "OUT" data_type: TYPE_STRING dims: [ 1 ]
    initial_state { data_type: TYPE_STRING dims: [ 1 ] data_file: "state.bin" name: "from_file" } } ]
}
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _data_file_model(repo: Path, kind: str, target: Path) -> tuple[str, str]:
    """A model whose warm-up or initial-state data file is a symlink to ``target``; (name, field in the reason)."""
    name = f"{kind}-{target.name}".replace(".", "-")
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    if kind == "warmup":
        (folder / "config.pbtxt").write_text(textwrap.dedent(WARMUP_CONFIG))
        (folder / "1" / "model.onnx").write_bytes(_model_bytes())
        (folder / "warmup").mkdir()
        os.symlink(target, folder / "warmup" / "in.bin")
        return name, "input_data_file 'warmup/in.bin'"
    (folder / "config.pbtxt").write_text(textwrap.dedent(STATE_CONFIG))
    (folder / "1" / "model.py").write_text(STATE_MODEL)
    (folder / "initial_state").mkdir()
    os.symlink(target, folder / "initial_state" / "state.bin")
    return name, "initial_state data_file 'initial_state/state.bin'"


@pytest.mark.parametrize("target", ["/proc/self/environ", "secret"])
@pytest.mark.parametrize("kind", ["warmup", "initial_state"])
def test_data_files_leading_out_of_the_model_folder_are_refused(
    server: ServerProcess, grpc_client, layout: dict[str, Path], kind: str, target: str
) -> None:
    path = Path(target) if target.startswith("/") else layout["outside"] / "secret.txt"
    name, field = _data_file_model(layout["repo"], kind, path)
    r = httpx.post(f"{server.base_url}/v2/repository/models/{name}/load", json={}, timeout=60)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"] and "leads outside the model's folder" in r.json()["error"], r.text
    (row,) = _index(server)[name]
    assert row["state"] == "UNAVAILABLE" and field in row["reason"] and "leads outside" in row["reason"], row
    with pytest.raises(InferenceServerException) as info:
        grpc_client.load_model(name)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and field in info.value.message()
    (grpc_row,) = [m for m in grpc_client.get_model_repository_index(as_json=True)["models"] if m["name"] == name]
    assert grpc_row["state"] == "UNAVAILABLE" and "leads outside" in grpc_row["reason"]
    infer = httpx.post(f"{server.base_url}/v2/models/{name}/infer", json=_sequence_start(), timeout=30)
    assert infer.status_code != 200
    answers = r.text + json.dumps(row) + info.value.message() + json.dumps(grpc_row) + infer.text
    assert SECRET not in answers
    _still_serving(server)


def _sequence_start() -> dict:
    return {
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}],
        "parameters": {"sequence_id": 1, "sequence_start": True},
    }


def test_data_files_inside_the_model_folder_keep_working(server: ServerProcess, layout: dict[str, Path]) -> None:
    """A warm-up file and an initial-state file that are symlinks within the model's own folder are read."""
    folder = layout["repo"] / "state-inside"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(STATE_CONFIG))
    (folder / "1" / "model.py").write_text(STATE_MODEL)
    (folder / "initial_state").mkdir()
    (folder / "state-data.bin").write_bytes(b"our own initial state")
    os.symlink("../state-data.bin", folder / "initial_state" / "state.bin")
    r = httpx.post(f"{server.base_url}/v2/repository/models/state-inside/load", json={}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.base_url}/v2/models/state-inside/infer", json=_sequence_start(), timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == ["our own initial state"], r.text

    folder = layout["repo"] / "warmup-inside"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(WARMUP_CONFIG))
    (folder / "1" / "model.onnx").write_bytes(_model_bytes())
    (folder / "warmup").mkdir()
    (folder / "data.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink("../data.bin", folder / "warmup" / "in.bin")
    r = httpx.post(f"{server.base_url}/v2/repository/models/warmup-inside/load", json={}, timeout=60)
    assert r.status_code == 200, r.text
    stats = httpx.get(f"{server.base_url}/v2/models/warmup-inside/stats").json()["model_stats"][0]
    assert stats["execution_count"] >= 1


def test_symlinks_swapped_while_the_server_loads_never_make_it_read_outside(
    server: ServerProcess, layout: dict[str, Path]
) -> None:
    """A tenant thread swaps the model file and the label file for symlinks out of the repository and back, as
    fast as it can, while the model is loaded again and again: every load either refuses the link or serves
    the model's own file (its own results, its own labels): nothing read between the check and the use can
    come from outside, because the use reads through the descriptor the check opened."""
    repo, outside = layout["repo"], layout["outside"]
    folder = _write(repo, "swapped", 'label_filename: "labels.txt"')
    (folder / "labels.txt").write_text("a\nb\nc\nd\n")
    (outside / "neg.onnx").write_bytes(unary("neg", "Neg", TensorProto.FLOAT, ["batch", 4]).SerializeToString())
    pairs = [(folder / "1" / "model.onnx", outside / "neg.onnx"), (folder / "labels.txt", outside / "secret.txt")]
    stop = threading.Event()
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        while not stop.is_set():
            for own, theirs in pairs:
                kept = own.with_name(own.name + ".kept")
                os.rename(own, kept)
                os.symlink(theirs, own)
                time.sleep(0.001)
                os.unlink(own)
                os.rename(kept, own)
                swaps += 1
                time.sleep(0.001)

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    outcomes = {"served": 0, "refused": 0, "missing": 0}
    deadline = time.monotonic() + 5
    try:
        while time.monotonic() < deadline:
            r = httpx.post(f"{server.base_url}/v2/repository/models/swapped/load", json={}, timeout=60)
            assert SECRET not in r.text
            if r.status_code == 200:
                outcomes["served"] += 1
                answer = _classify(server, "swapped")
                assert SECRET not in answer.text
                assert answer.json()["outputs"][0]["data"] == [
                    "4.000000:0:a",
                    "3.000000:1:b",
                    "2.000000:2:c",
                    "1.000000:3:d",
                ], answer.text  # relu with our labels: never their model (negative scores) or their labels
            else:  # the link refused, or the file caught in the instant it was renamed away
                assert r.status_code == 400, r.text
                outcomes["refused" if "leads outside the model repository" in r.text else "missing"] += 1
    finally:
        stop.set()
        thread.join(timeout=10)
    assert outcomes["served"] >= 3 and outcomes["refused"] >= 1 and swaps > 100, (outcomes, swaps)
    assert SECRET not in json.dumps(_index(server).get("swapped"))
    _still_serving(server)
