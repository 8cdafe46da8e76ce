"""TensorFlow SavedModels (platform tensorflow_savedmodel) on a real server, called with tritonclient over HTTP
and gRPC.

Every SavedModel is built here (``tests/support/tf_models``, tf.Module and Keras) with fixed seeds; served
outputs are compared with the same SavedModel run in this process through TF2's eager loader (the server
runs it in a session, as Triton does). Without tensorflow the module is skipped with the reason
(test_tensorflow_missing.py covers that path).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="tensorflow is not installed: pip install kubeinfer[tensorflow]",
)

if importlib.util.find_spec("tensorflow") is not None:
    from tests.support import tf_worker as tm

SAVED = "model.savedmodel"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
#: graph-loop rounds of the spin model: ~0.7 s an execution here (3000: 0.13 s), long next to the request overhead
SPIN_ROUNDS = 15_000


def _model(repo: Path, name: str, config: str | None, build: Any, versions: tuple[int, ...] = (1,)) -> Path:
    """``<repo>/<name>/<v>/model.savedmodel`` for each version (``build(path)``), and config.pbtxt when given."""
    folder = repo / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True)
        build(folder / str(v) / SAVED)
    if config is not None:
        (folder / "config.pbtxt").write_text(textwrap.dedent(config).replace("{name}", name))
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of SavedModels, copied into the repository below and used as references here."""
    root = tmp_path_factory.mktemp("tf_models")
    tm.save_linear(root / "linear", seed=7)
    tm.save_linear(root / "linear_v2", seed=8)
    tm.save_keras_classifier(root / "keras", seed=3)
    tm.save_types(root / "types")
    for name, module in (
        ("spin", "Spin"),
        ("fixed", "Fixed"),
        ("per_row", "PerRow"),
        ("any_rank", "AnyRank"),
    ):
        tm.save_module(module, root / name)
    return root


def _copy(source: Path) -> Any:
    return lambda target: shutil.copytree(source, target)


@pytest.fixture(scope="module")
def repo(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tensorflow") / "repo"
    # no config at all: the platform from the folder, everything else from the signature
    _model(root, "keras", None, _copy(built / "keras"))
    _model(root, "linear", 'platform: "tensorflow_savedmodel"\n', _copy(built / "linear"))
    versions = iter([built / "linear", built / "linear_v2"])
    _model(
        root,
        "linear_versions",
        'platform: "tensorflow_savedmodel"\nversion_policy: { all { } }\n',
        lambda target: shutil.copytree(next(versions), target),
        versions=(1, 2),
    )
    _model(
        root,
        "batched",
        """
        platform: "tensorflow_savedmodel"
        max_batch_size: 8
        dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 3000000 }
        """,
        _copy(built / "linear"),
    )
    _model(
        root,
        "scaled",
        """
        platform: "tensorflow_savedmodel"
        parameters { key: "TF_SIGNATURE_DEF" value { string_value: "scaled" } }
        """,
        _copy(built / "linear"),
    )
    # Triton's full form, every field written out
    _model(
        root,
        "explicit",
        """
        name: "{name}"
        platform: "tensorflow_savedmodel"
        max_batch_size: 2
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
        """,
        _copy(built / "linear"),
    )
    _model(root, "types", 'platform: "tensorflow_savedmodel"\n', _copy(built / "types"))
    _model(root, "fixed", 'platform: "tensorflow_savedmodel"\n', _copy(built / "fixed"))
    _model(root, "per_row", 'platform: "tensorflow_savedmodel"\n', _copy(built / "per_row"))
    _model(
        root,
        "any_rank",
        """
        platform: "tensorflow_savedmodel"
        max_batch_size: 0
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
        output [ { name: "negated" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
        """,
        _copy(built / "any_rank"),
    )
    _model(
        root,
        "spin",
        """
        platform: "tensorflow_savedmodel"
        instance_group [ { count: 2 kind: KIND_CPU } ]
        parameters { key: "TF_USE_PER_SESSION_THREADS" value { string_value: "yes" } }
        parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "1" } }
        parameters { key: "TF_NUM_INTER_THREADS" value { string_value: "1" } }
        """,
        _copy(built / "spin"),
    )
    if HAVE_TORCH:  # both frameworks in one server process
        from tests.support import torch_models

        torch_models.save_torchscript(torch_models.Pair(), root / "torch_pair" / "1" / "model.pt")
        (root / "torch_pair" / "config.pbtxt").write_text(
            'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
            'input [ { name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "b" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            'output [ { name: "SUM__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        )
    _bad_models(root, built)
    return root


#: model → what its UNAVAILABLE reason says
BAD = {
    "no_saved_model_pb": "SavedModel file does not exist at: ",
    "garbage_pb": "saved_model.pb is not a SavedModel",
    "no_variables": "unable to load model 'no_variables' from ",
    "wrong_signature": "unable to load model 'wrong_signature', expected 'predict' signature (the SavedModel's "
    "signatures: scaled, serving_default)",
    "wrong_tag": "unable to load model 'wrong_tag', expected 'gpu' tag (the SavedModel's tag sets: {serve}",
    "wrong_input_name": "unexpected inference input 'INPUT0', allowed inputs are: x",
    "wrong_output_name": "unexpected inference output 'OUTPUT0', allowed outputs are: s, y",
    "wrong_type": "unable to load model 'wrong_type', configuration expects datatype TYPE_INT32 for input 'x', "
    "model provides TYPE_FP32",
    "wrong_dims": "model 'wrong_dims', tensor 'x': the model expects 2 dimensions (shape [-1,4]) but the model "
    "configuration specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the "
    "explicit tensor shape, making complete shape [-1,5])",
    "too_many_inputs": "unable to load model 'too_many_inputs', configuration expects 2 inputs, model provides 1",
    "batch_without_batch_dim": "unable to autofill for 'batch_without_batch_dim', configuration specified max-batch 4 "
    "but model signature does not support batching",
    "rank_unknown": "Unable to autofill for 'rank_unknown': the rank of model tensor 'x' is 0 which is not supported",
    "bad_share_count": "parameter 'MAX_SESSION_SHARE_COUNT' must be positive number for TensorFlow model "
    "'bad_share_count'",
    "link_out": "leads outside the model repository through a symlink",
    "cpu_accelerator": "CPU Execution Accelerator is not supported in TensorFlow backend",
}


def _bad_models(root: Path, built: Path) -> None:
    platform = 'platform: "tensorflow_savedmodel"\n'
    linear = _copy(built / "linear")

    def empty(target: Path) -> None:
        target.mkdir()

    def garbage(target: Path) -> None:
        target.mkdir()
        (target / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff this is not a protobuf")

    def no_variables(target: Path) -> None:
        shutil.copytree(built / "linear", target)
        shutil.rmtree(target / "variables")

    def link_out(target: Path) -> None:
        shutil.copytree(built / "linear", target)
        index = target / "variables" / "variables.index"
        outside = root.parent / "outside.index"
        shutil.move(index, outside)
        index.symlink_to(outside)

    _model(root, "no_saved_model_pb", platform, empty)
    _model(root, "garbage_pb", platform, garbage)
    _model(root, "no_variables", platform, no_variables)
    _model(root, "link_out", platform, link_out)
    _model(
        root,
        "wrong_signature",
        platform + 'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "predict" } }\n',
        linear,
    )
    _model(root, "wrong_tag", platform + 'parameters { key: "TF_GRAPH_TAG" value { string_value: "gpu" } }\n', linear)
    _model(
        root,
        "bad_share_count",
        platform + 'parameters { key: "MAX_SESSION_SHARE_COUNT" value { string_value: "0" } }\n',
        linear,
    )
    full = """
        platform: "tensorflow_savedmodel"
        max_batch_size: 4
        input [ {inputs} ]
        output [ {outputs} ]
        """
    x = '{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }'
    y = '{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }'
    for name, inputs, outputs in (
        ("wrong_input_name", '{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }', y),
        ("wrong_output_name", x, '{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }'),
        ("wrong_type", '{ name: "x" data_type: TYPE_INT32 dims: [ 4 ] }', y),
        ("wrong_dims", '{ name: "x" data_type: TYPE_FP32 dims: [ 5 ] }', y),
        ("too_many_inputs", x + ', { name: "k" data_type: TYPE_INT32 dims: [ 1 ] }', y),
    ):
        _model(root, name, full.replace("{inputs}", inputs).replace("{outputs}", outputs), linear)
    _model(
        root,
        "cpu_accelerator",
        platform + 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }\n',
        linear,
    )
    _model(root, "batch_without_batch_dim", platform + "max_batch_size: 4\n", _copy(built / "fixed"))
    _model(root, "rank_unknown", platform, _copy(built / "any_rank"))


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    s = start_server(repo, log_dir=repo.parent)
    yield s
    s.terminate()


def _client(server: ServerProcess, protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _datatype(array: np.ndarray) -> str:
    if array.dtype == np.object_:
        return "BYTES"
    if array.dtype == ml_dtypes.bfloat16:
        return "BF16"
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(array.dtype))


def _infer(module: Any, client: Any, model: str, arrays: dict[str, np.ndarray], version: str = "", outputs=None):  # type: ignore[no-untyped-def]
    inputs = []
    for name, array in arrays.items():
        inp = module.InferInput(name, list(array.shape), _datatype(array))
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    requested = [module.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, inputs, model_version=version, outputs=requested)


def _config(server: ServerProcess, model: str) -> dict[str, Any]:
    return dict(httpx.get(f"{server.base_url}/v2/models/{model}/config", timeout=30).json())


def _rows(seed: int, rows: int, width: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)


# ---- auto-complete ------------------------------------------------------------------------------------


def test_auto_complete_fills_the_config_from_the_serving_signature(server: ServerProcess) -> None:
    config = _config(server, "linear")
    assert config["backend"] == "tensorflow" and config["default_model_filename"] == SAVED
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size: every tensor has a batch dim
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("x", "TYPE_FP32", [4])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("s", "TYPE_FP32", [1]),
        ("y", "TYPE_FP32", [3]),
    ]
    # Triton's default for TensorFlow CPU groups: two instances
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 2)]


def test_a_folder_without_config_is_detected_as_a_savedmodel(server: ServerProcess) -> None:
    config = _config(server, "keras")
    assert config["platform"] == "tensorflow_savedmodel"
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("features", [8])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("output_0", [3])]


def test_auto_complete_without_a_batch_dimension_and_for_per_row_tensors(server: ServerProcess) -> None:
    fixed = _config(server, "fixed")
    assert fixed["max_batch_size"] == 0 and "dynamic_batching" not in fixed
    assert fixed["input"][0]["dims"] == [2, 4] and fixed["output"][0]["dims"] == [2, 4]
    per_row = _config(server, "per_row")
    assert per_row["max_batch_size"] == 4
    # a [batch] tensor: dims [1] and an empty reshape, as Triton's TensorFlow backend fills it
    assert per_row["input"][0]["dims"] == [1] and per_row["input"][0]["reshape"] == {"shape": []}
    assert per_row["output"][0]["dims"] == [1] and per_row["output"][0]["reshape"] == {"shape": []}


def test_the_config_selects_another_signature(server: ServerProcess) -> None:
    config = _config(server, "scaled")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("k", "TYPE_INT32", [1]),
        ("x", "TYPE_FP32", [4]),
    ]
    assert [t["name"] for t in config["output"]] == ["z"]


# ---- inference ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_equal_tensorflow_in_process(server: ServerProcess, built: Path, protocol: str) -> None:
    module, client = _client(server, protocol)
    x = _rows(1, 3)
    result = _infer(module, client, "linear", {"x": x})
    expected = tm.reference(built / "linear", {"x": x})
    for name in ("y", "s"):
        np.testing.assert_allclose(result.as_numpy(name), expected[name], rtol=1e-6, atol=1e-6)
    features = _rows(2, 4, width=8)
    probs = _infer(module, client, "keras", {"features": features}).as_numpy("output_0")
    np.testing.assert_allclose(probs, tm.reference(built / "keras", {"features": features})["output_0"], rtol=1e-5)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    # one output asked for: only that one comes back
    only = _infer(module, client, "linear", {"x": x}, outputs=["s"])
    assert only.as_numpy("y") is None
    np.testing.assert_allclose(only.as_numpy("s"), expected["s"], rtol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tf_signature_def_serves_that_signature(server: ServerProcess, built: Path, protocol: str) -> None:
    module, client = _client(server, protocol)
    x = _rows(4, 2)
    k = np.array([[2], [-3]], dtype=np.int32)
    got = _infer(module, client, "scaled", {"x": x, "k": k}).as_numpy("z")
    np.testing.assert_allclose(got, tm.reference(built / "linear", {"x": x, "k": k}, "scaled")["z"], rtol=1e-6)
    np.testing.assert_allclose(got, x * k, rtol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_version_serves_its_own_savedmodel(server: ServerProcess, built: Path, protocol: str) -> None:
    module, client = _client(server, protocol)
    x = _rows(5, 2)
    for version, source in (("1", "linear"), ("2", "linear_v2")):
        got = _infer(module, client, "linear_versions", {"x": x}, version=version).as_numpy("y")
        np.testing.assert_allclose(got, tm.reference(built / source, {"x": x})["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_explicit_config_and_shapes_without_batching(server: ServerProcess, built: Path, protocol: str) -> None:
    module, client = _client(server, protocol)
    x = _rows(6, 2)
    y = _infer(module, client, "explicit", {"x": x}).as_numpy("y")
    np.testing.assert_allclose(y, tm.reference(built / "linear", {"x": x})["y"], rtol=1e-6, atol=1e-6)
    fixed = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_infer(module, client, "fixed", {"x": fixed}).as_numpy("doubled"), fixed * 2)
    v = np.array([[1.0], [2.5], [-4.0]], dtype=np.float32)
    np.testing.assert_array_equal(_infer(module, client, "per_row", {"v": v}).as_numpy("tripled"), v * 3)
    # an unknown-rank input takes the config's dims, variable ones included
    wide = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(_infer(module, client, "any_rank", {"x": wide}).as_numpy("negated"), -wide)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_data_type_round_trips(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    rng = np.random.default_rng(9)
    arrays: dict[str, np.ndarray] = {}
    for name in tm.TYPES:
        if name == "text":
            arrays[name] = np.array([[b"a", b"bc", "\u00e9".encode()], [b"", b"x y", b"z"]], dtype=np.object_)
        elif name == "flag":
            arrays[name] = rng.integers(0, 2, (2, 3)).astype(np.bool_)
        elif name == "bf16":
            arrays[name] = rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16)
        elif name.startswith("f"):
            arrays[name] = rng.standard_normal((2, 3)).astype(
                {"f16": np.float16, "f32": np.float32, "f64": np.float64}[name]
            )
        else:
            dtype = np.dtype({"i": "int", "u": "uint"}[name[0]] + name[1:])
            arrays[name] = rng.integers(0, 100, (2, 3)).astype(dtype)
    result = _infer(module, client, "types", arrays)
    for name, sent in arrays.items():
        got = result.as_numpy(f"out_{name}")
        if name == "text":
            assert got.tolist() == [[v.upper() for v in row] for row in sent.tolist()]
        elif name == "flag":
            np.testing.assert_array_equal(got, ~sent)
        elif name == "f32":
            np.testing.assert_array_equal(got, sent + 1)
        else:
            assert got.dtype == sent.dtype, name
            np.testing.assert_array_equal(got.view(np.uint8), sent.view(np.uint8))


def test_concurrent_requests_form_one_batch(server: ServerProcess, built: Path) -> None:
    """Four concurrent one-row requests reach preferred_batch_size 4 inside the 3 s window: one execution."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    rows = [_rows(20 + i, 1) for i in range(4)]
    try:
        pending = []
        for x in rows:
            inp = httpclient.InferInput("x", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            pending.append(client.async_infer("batched", [inp]))
        results = [p.get_result() for p in pending]
    finally:
        client.close()
    for x, result in zip(rows, results, strict=True):
        expected = tm.reference(built / "linear", {"x": x})
        np.testing.assert_allclose(result.as_numpy("y"), expected["y"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("s"), expected["s"], rtol=1e-6)
    stats = httpx.get(f"{server.base_url}/v2/models/batched/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_count"] == 4
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {4: 1}, sizes


def test_two_instances_execute_at_the_same_time(server: ServerProcess, built: Path) -> None:
    """Two long graph loops on the two instances (each its own session with one thread): the server spends
    more compute time on them than the wall clock they take together, which only overlap allows."""
    x = np.full((48, 48), 0.01, dtype=np.float32)
    rounds = np.array([SPIN_ROUNDS], dtype=np.int64)

    def call(_: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600, connection_timeout=600)
        try:
            return np.asarray(_infer(httpclient, client, "spin", {"x": x, "rounds": rounds}).as_numpy("y"))
        finally:
            client.close()

    before = _compute_ns(server, "spin")
    start = time.perf_counter_ns()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(call, range(2)))
    elapsed = time.perf_counter_ns() - start
    spent, executions = (a - b for a, b in zip(_compute_ns(server, "spin"), before, strict=True))
    expected = tm.reference(built / "spin", {"x": x, "rounds": rounds})["y"]
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert executions == 2
    assert spent > 1.3 * elapsed, f"2 executions took {spent / 1e9:.2f} s of compute in {elapsed / 1e9:.2f} s"


def _compute_ns(server: ServerProcess, model: str) -> tuple[int, int]:
    stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
    infer = stats["inference_stats"]["compute_infer"]
    return int(infer["ns"]), int(infer["count"])


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed: pip install kubeinfer[pytorch]")
def test_tensorflow_and_pytorch_models_serve_from_one_process(server: ServerProcess, built: Path) -> None:
    module, client = _client(server, "grpc")
    a, b = _rows(30, 2, width=3), _rows(31, 2, width=3)
    np.testing.assert_allclose(_infer(module, client, "torch_pair", {"a": a, "b": b}).as_numpy("SUM__0"), a + b)
    x = _rows(32, 2)
    np.testing.assert_allclose(
        _infer(module, client, "linear", {"x": x}).as_numpy("y"),
        tm.reference(built / "linear", {"x": x})["y"],
        rtol=1e-6,
    )


# ---- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_savedmodels_are_unavailable_with_the_reason(server: ServerProcess, protocol: str) -> None:
    _, client = _client(server, protocol)
    if protocol == "http":
        rows = {r["name"]: r for r in client.get_model_repository_index()}
    else:
        rows = {r.name: {"state": r.state, "reason": r.reason} for r in client.get_model_repository_index().models}
    for name, reason in BAD.items():
        assert rows[name]["state"] == "UNAVAILABLE", (name, rows[name])
        assert reason in rows[name]["reason"], (name, rows[name]["reason"])
    # the good models next to them serve
    assert client.is_model_ready("linear") and client.is_model_ready("keras")


def test_a_request_to_a_bad_savedmodel_is_refused_and_the_server_keeps_serving(server: ServerProcess) -> None:
    module, client = _client(server, "http")
    with pytest.raises(InferenceServerException) as info:
        _infer(module, client, "garbage_pb", {"x": _rows(0, 1)})
    # the server's answer for any model that failed to load (UNAVAILABLE), with the load's reason
    assert info.value.status() == "503", info.value
    assert "saved_model.pb is not a SavedModel" in info.value.message()
    assert _infer(module, client, "linear", {"x": _rows(0, 1)}).as_numpy("y").shape == (1, 3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_wrong_shape_is_a_clear_request_error(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    with pytest.raises(InferenceServerException) as info:
        _infer(module, client, "linear", {"x": _rows(0, 2, width=5)})
    assert "unexpected shape for input 'x' for model 'linear'" in info.value.message()
    assert info.value.status() == {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}[protocol]


def test_the_log_says_nothing_was_read_outside_the_repository(server: ServerProcess, repo: Path) -> None:
    """The link_out model's variables file was never opened: its bytes are outside, and the load refused."""
    assert (repo.parent / "outside.index").is_file()
    assert "link_out" in server.log() and "leads outside the model repository" in server.log()
    assert os.path.islink(repo / "link_out" / "1" / SAVED / "variables" / "variables.index")
