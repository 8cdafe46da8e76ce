"""TensorFlow GraphDefs (platform tensorflow_graphdef, ``<version>/model.graphdef``) on a real server, called with
tritonclient over HTTP and gRPC and compared with numpy.

The GraphDefs are built here with TensorFlow's v1 graph API in a child process (the pytest process never
imports tensorflow: see ``tests/support/tf_worker``): add/sub graphs on two placeholders, with a batch
dimension and without, a string graph, and a dense layer whose variables are frozen into constants. Bad
configs and files fail their model's load with Triton's texts while the server serves the rest. Without
tensorflow the server tests are skipped with the reason (test_tensorflow_missing.py covers that path).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.config import pb
from kubeinfer.server.config.platforms import detect, model_filename, model_is_folder, platform_undecided, row_for
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server

needs_tf = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="tensorflow is not installed: pip install kubeinfer[tensorflow]",
)

GRAPHDEF = "model.graphdef"

#: run in a child process: writes <out>/<name>.graphdef for each graph, and dense.npz (its weights)
BUILD = r"""
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
out = Path(sys.argv[1])


def write(name, graph_def):
    (out / f"{name}.graphdef").write_bytes(graph_def.SerializeToString())


def add_sub(dtype, shape):
    g = tf.Graph()
    with g.as_default():
        a = tf1.placeholder(dtype, shape, name="INPUT0")
        b = tf1.placeholder(dtype, shape, name="INPUT1")
        tf.identity(tf.add(a, b), name="OUTPUT0")
        tf.identity(tf.subtract(a, b), name="OUTPUT1")
    return g.as_graph_def()


write("add_sub_int32", add_sub(tf.int32, [None, 16]))
write("add_sub_fp32", add_sub(tf.float32, [4]))

g = tf.Graph()
with g.as_default():
    text = tf1.placeholder(tf.string, [None, 2], name="TEXT")
    tf.strings.upper(text, name="UPPER")
write("strings", g.as_graph_def())

rng = np.random.default_rng(5)
w_value = rng.standard_normal((4, 3)).astype(np.float32)
b_value = rng.standard_normal(3).astype(np.float32)
g = tf.Graph()
with g.as_default():
    x = tf1.placeholder(tf.float32, [None, 4], name="x")
    w = tf1.Variable(w_value, name="w")
    b = tf1.Variable(b_value, name="b")
    tf.nn.relu(tf.matmul(x, w) + b, name="y")
    with tf1.Session(graph=g) as session:
        session.run(tf1.global_variables_initializer())
        frozen = tf1.graph_util.convert_variables_to_constants(session, g.as_graph_def(), ["y"])
assert not [n.op for n in frozen.node if "Var" in n.op], [n.op for n in frozen.node]
write("dense", frozen)
np.savez(out / "dense.npz", w=w_value, b=b_value)
write("empty", tf1.GraphDef())
"""


def _build(out: Path) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(out)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]


def _model(repo: Path, name: str, config: str | None, graph: Path | bytes, filename: str = GRAPHDEF) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (version / filename).write_bytes(graph if isinstance(graph, bytes) else graph.read_bytes())
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


INT32_IO = """
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
FP32_IO = """
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
GRAPH = 'platform: "tensorflow_graphdef"\n'

#: model → what its load failure says (Triton's texts, and ours where Triton has none)
BAD = {
    "wrong_input_name": "unexpected inference input 'X', allowed inputs are: INPUT0, INPUT1",
    "too_many_inputs": "unable to load model 'too_many_inputs', configuration expects 3 inputs, model provides at most 2",
    "output_not_in_graph": "unexpected inference output 'NOPE', allowed outputs are: Add, OUTPUT0, OUTPUT1, Sub",
    "missing_control": "configuration specified sequence control 'START', but model does not provide that input",
    "empty_network": "model empty_network has an empty network",
    "corrupt": "Can't parse ",
    "wrong_type": "unable to load model 'wrong_type', configuration expects datatype TYPE_FP32 for input 'INPUT0', "
    "model provides TYPE_INT32",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("graphdefs")
    _build(root)
    return root


@pytest.fixture(scope="module")
def repo(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tensorflow_graphdef") / "repo"
    int32, fp32 = built / "add_sub_int32.graphdef", built / "add_sub_fp32.graphdef"
    _model(root, "add_sub", GRAPH + "max_batch_size: 8\n" + INT32_IO, int32)
    _model(
        root,
        "batched",
        GRAPH
        + "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 3000000 }\n"
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + INT32_IO,
        int32,
    )
    _model(
        root,
        "no_batch",
        GRAPH
        + 'parameters { key: "TF_NUM_INTRA_THREADS" value { string_value: "1" } }\n'
        + 'parameters { key: "MAX_SESSION_SHARE_COUNT" value { string_value: "2" } }\n'
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        + FP32_IO,
        fp32,
    )
    # backend "tensorflow" alone: the version folder's model.graphdef makes it a GraphDef (Triton's AutoFill)
    _model(root, "backend_only", 'backend: "tensorflow"\n' + FP32_IO, fp32)
    # ... and so does a default_model_filename of model.graphdef
    _model(root, "by_filename", 'backend: "tensorflow"\ndefault_model_filename: "model.graphdef"\n' + FP32_IO, fp32)
    # a GraphDef under another name; instances placed where the graph says (KIND_MODEL: no device set)
    _model(
        root,
        "renamed",
        GRAPH + 'default_model_filename: "frozen.pb"\ninstance_group [ { kind: KIND_MODEL } ]\n' + FP32_IO,
        fp32,
        filename="frozen.pb",
    )
    _model(
        root,
        "strings",
        GRAPH
        + "max_batch_size: 4\n"
        + 'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
        + 'output [ { name: "UPPER" data_type: TYPE_STRING dims: [ 2 ] } ]\n',
        built / "strings.graphdef",
    )
    _model(
        root,
        "dense",
        GRAPH
        + "max_batch_size: 16\n"
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        + 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
        built / "dense.graphdef",
    )
    # the bad ones
    _model(root, "wrong_input_name", GRAPH + INT32_IO.replace('"INPUT0"', '"X"', 1), int32)
    three = INT32_IO.replace(
        " ]\n    output", ', { name: "INPUT2" data_type: TYPE_INT32 dims: [ 16 ] } ]\n    output', 1
    )
    _model(root, "too_many_inputs", GRAPH + three, int32)
    _model(root, "output_not_in_graph", GRAPH + INT32_IO.replace('"OUTPUT1"', '"NOPE"'), int32)
    _model(
        root,
        "missing_control",
        GRAPH
        + "max_batch_size: 8\n"
        + 'sequence_batching { control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START '
        + "int32_false_true: [ 0, 1 ] } ] } ] }\n"
        + INT32_IO,
        int32,
    )
    _model(root, "empty_network", GRAPH + FP32_IO, built / "empty.graphdef")
    _model(root, "corrupt", GRAPH + FP32_IO, b"\x0a\xff\xff\xff this is not a protobuf")
    _model(root, "wrong_type", GRAPH + INT32_IO.replace("TYPE_INT32", "TYPE_FP32", 1), int32)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    s = start_server(repo, log_dir=repo.parent)
    yield s
    s.terminate()


def _client(server: ServerProcess, protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _infer(module: Any, client: Any, model: str, arrays: dict[str, np.ndarray]) -> Any:
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else {"int32": "INT32", "float32": "FP32"}[str(array.dtype)]
        inp = module.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return client.infer(model, inputs)


# ---- the platform table (no TensorFlow needed) --------------------------------------------------------


def test_the_table_knows_graphdef_as_a_single_file_tensorflow_model() -> None:
    graph = pb.ModelConfig(platform="tensorflow_graphdef")
    assert model_filename(graph) == GRAPHDEF and not model_is_folder(graph)
    # backend "tensorflow" alone stays a SavedModel unless default_model_filename or the files say GraphDef
    assert model_filename(pb.ModelConfig(backend="tensorflow")) == "model.savedmodel"
    renamed = pb.ModelConfig(backend="tensorflow", default_model_filename=GRAPHDEF)
    row = row_for(renamed)
    assert row is not None and row.platform == "tensorflow_graphdef" and not platform_undecided(renamed)
    assert platform_undecided(pb.ModelConfig(backend="tensorflow"))
    assert not platform_undecided(pb.ModelConfig(backend="onnxruntime"))
    found = detect({GRAPHDEF}, set())
    assert found is not None and found.platform == "tensorflow_graphdef"
    # a folder named model.graphdef is not one; a file named model.savedmodel is not a SavedModel
    assert detect(set(), {GRAPHDEF}) is None and detect({"model.savedmodel"}, set()) is None
    # both: GraphDef, as Triton's AutoFill tests model.graphdef last
    both = detect({GRAPHDEF}, {"model.savedmodel"}, backend="tensorflow")
    assert both is not None and both.platform == "tensorflow_graphdef"
    assert detect({"model.onnx", GRAPHDEF}, set(), backend="onnxruntime") is not None


def test_the_operator_renders_a_graphdef_model_as_one_file() -> None:
    from kubeinfer.operator.models.render import render_model

    spec = {
        "server": "s",
        "platform": "tensorflow_graphdef",
        "maxBatchSize": 8,
        "inputs": [{"name": "INPUT0", "dataType": "INT32", "dims": [16]}],
        "outputs": [{"name": "OUTPUT0", "dataType": "INT32", "dims": [16]}],
        "versions": [
            {"version": 1, "source": {"uri": "https://models.example.com/g/1/model.graphdef", "sha256": "a" * 64}}
        ],
    }
    model = render_model("g", spec)
    assert model.filename == GRAPHDEF and not model_is_folder(model.config)
    assert 'platform: "tensorflow_graphdef"' in model.config_text


# ---- serving ------------------------------------------------------------------------------------------


@needs_tf
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_with_a_batch_dimension(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (3, 16), dtype=np.int32)
    result = _infer(module, client, "add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@needs_tf
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["no_batch", "backend_only", "by_filename", "renamed"])
def test_add_sub_without_batching(server: ServerProcess, protocol: str, model: str) -> None:
    module, client = _client(server, protocol)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    result = _infer(module, client, model, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


@needs_tf
def test_the_config_is_completed_as_a_graphdef(server: ServerProcess) -> None:
    for model, filename in (
        ("add_sub", GRAPHDEF),
        ("backend_only", GRAPHDEF),
        ("by_filename", GRAPHDEF),
        ("renamed", "frozen.pb"),
    ):
        config = httpx.get(f"{server.base_url}/v2/models/{model}/config", timeout=30).json()
        assert config["platform"] == "tensorflow_graphdef", config
        assert config["backend"] == "tensorflow" and config["default_model_filename"] == filename, config
    # nothing is auto-completed from a GraphDef: the inputs stay as written, max_batch_size 0 when absent
    config = httpx.get(f"{server.base_url}/v2/models/no_batch/config", timeout=30).json()
    assert config["max_batch_size"] == 0 and [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]


@needs_tf
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_frozen_dense_layer(server: ServerProcess, built: Path, protocol: str) -> None:
    module, client = _client(server, protocol)
    weights = np.load(built / "dense.npz")
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    got = _infer(module, client, "dense", {"x": x}).as_numpy("y")
    np.testing.assert_allclose(got, np.maximum(x @ weights["w"] + weights["b"], 0), rtol=1e-5, atol=1e-6)


@needs_tf
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_strings(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    text = np.array([[b"abc", b"Hello"], [b"", b"x y"]], dtype=np.object_)
    got = _infer(module, client, "strings", {"TEXT": text}).as_numpy("UPPER")
    assert got.tolist() == [[b"ABC", b"HELLO"], [b"", b"X Y"]]


@needs_tf
def test_concurrent_requests_form_one_batch(server: ServerProcess) -> None:
    """Four concurrent one-row requests reach preferred_batch_size 4 inside the 3 s window: one execution."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    rng = np.random.default_rng(4)
    pairs = [
        (rng.integers(0, 100, (1, 16), dtype=np.int32), rng.integers(0, 100, (1, 16), dtype=np.int32)) for _ in range(4)
    ]
    try:
        pending = []
        for a, b in pairs:
            inputs = []
            for name, array in (("INPUT0", a), ("INPUT1", b)):
                inp = httpclient.InferInput(name, [1, 16], "INT32")
                inp.set_data_from_numpy(array)
                inputs.append(inp)
            pending.append(client.async_infer("batched", inputs))
        results = [p.get_result() for p in pending]
    finally:
        client.close()
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    stats = httpx.get(f"{server.base_url}/v2/models/batched/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_count"] == 4
    sizes = {s["batch_size"]: s["compute_infer"]["count"] for s in stats["batch_stats"]}
    assert sizes == {4: 1}, sizes


# ---- errors -------------------------------------------------------------------------------------------


@needs_tf
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_models_are_unavailable_with_tritons_reason(server: ServerProcess, protocol: str) -> None:
    _, client = _client(server, protocol)
    if protocol == "http":
        rows = {r["name"]: r for r in client.get_model_repository_index()}
    else:
        rows = {r.name: {"state": r.state, "reason": r.reason} for r in client.get_model_repository_index().models}
    for name, reason in BAD.items():
        assert rows[name]["state"] == "UNAVAILABLE", (name, rows[name])
        assert reason in rows[name]["reason"], (name, rows[name]["reason"])
    assert f"{os.sep}corrupt{os.sep}1{os.sep}{GRAPHDEF} as binary proto" in rows["corrupt"]["reason"]
    assert client.is_model_ready("add_sub") and client.is_model_ready("dense")


@needs_tf
def test_a_request_to_a_bad_model_is_refused_and_the_server_keeps_serving(server: ServerProcess) -> None:
    module, client = _client(server, "http")
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        _infer(module, client, "wrong_input_name", {"INPUT0": a, "INPUT1": a})
    assert info.value.status() == "503", info.value
    assert "unexpected inference input 'X'" in info.value.message()
    np.testing.assert_array_equal(_infer(module, client, "add_sub", {"INPUT0": a, "INPUT1": a}).as_numpy("OUTPUT0"), a)
