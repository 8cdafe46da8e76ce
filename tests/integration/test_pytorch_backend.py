"""PyTorch models (platform pytorch_libtorch) on a real server, called with tritonclient over HTTP and gRPC.

Every model is generated here with a fixed seed; served outputs are compared with the module's own
outputs in this process. Without torch installed the whole module is skipped with the reason
(test_pytorch_missing.py covers that path).
"""

from __future__ import annotations

import importlib.util
import os
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.server import ServerProcess, start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed: pip install kubeinfer[pytorch]"
)

if importlib.util.find_spec("torch") is not None:
    import torch

    from tests.support import torch_models as tm

# the Triton tutorial config, dims adapted to the generated classifier ([3, 16, 16] → 10 classes)
TUTORIAL_CONFIG = """
name: "resnet_classifier"
platform: "pytorch_libtorch"
max_batch_size: 16
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""
SEEDS = {1: 11, 2: 22}
SPIN_ROUNDS = 10_000  # ~1 s per forward in the server here: the two requests overlap even if one starts late


def _write(repo: Path, name: str, config: str, files: dict[int, object] | None = None) -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(config).replace("{name}", name))
    for version, module in (files or {1: None}).items():
        (model_dir / str(version)).mkdir(exist_ok=True)
        if module is not None:
            tm.save_torchscript(module, model_dir / str(version) / "model.pt")
    return model_dir


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pytorch") / "repo"
    classifiers = {v: tm.classifier(seed) for v, seed in SEEDS.items()}
    _write(root, "resnet_classifier", TUTORIAL_CONFIG, classifiers)
    _write(
        root,
        "resnet_all_versions",
        TUTORIAL_CONFIG.replace('"resnet_classifier"', '"{name}"') + "version_policy: { all { } }\n",
        classifiers,
    )
    _write(
        root,
        "batched",
        TUTORIAL_CONFIG.replace('"resnet_classifier"', '"{name}"')
        + "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 3000000 }\n",
        {1: classifiers[1]},
    )
    # inputs declared in the opposite order of forward(image, scale): bound by argument name
    _write(
        root,
        "named",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] },
                { name: "image" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "total__1" data_type: TYPE_FP32 dims: [ 1 ] },
                 { name: "scaled__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """,
        {1: tm.Named()},
    )
    # <name>__<index> on both sides, declared out of order
    _write(
        root,
        "pair",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "B__1" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "A__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
        output [ { name: "PRODUCT__2" data_type: TYPE_FP32 dims: [ 3 ] },
                 { name: "SUM__0" data_type: TYPE_FP32 dims: [ 3 ] },
                 { name: "DIFFERENCE__1" data_type: TYPE_FP32 dims: [ 3 ] } ]
        """,
        {1: tm.Pair()},
    )
    # names that follow no convention: config order, as Triton
    _write(
        root,
        "pair_ordered",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 0
        input [ { name: "first" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "second" data_type: TYPE_FP32 dims: [ 3 ] } ]
        output [ { name: "plus" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "minus" data_type: TYPE_FP32 dims: [ 3 ] } ]
        """,
        {1: tm.Pair()},
    )
    _write(
        root,
        "list_result",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 2 ] } ]
        output [ { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 2 ] }, { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 2 ] } ]
        """,
        {1: tm.ListResult()},
    )
    _write(
        root,
        "dict_input",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "right" data_type: TYPE_INT64 dims: [ 2 ] }, { name: "left" data_type: TYPE_INT64 dims: [ 2 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 2 ] } ]
        """,
        {1: tm.DictInput()},
    )
    types = ["FP16", "BF16", "INT8", "INT16", "INT32", "INT64", "BOOL", "UINT8", "FP64"]
    args = ["f16", "bf16", "i8", "i16", "i32", "i64", "flag", "u8", "f64"]
    _write(
        root,
        "all_types",
        'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        + "input [ "
        + ", ".join(f'{{ name: "{a}" data_type: TYPE_{t} dims: [ 3 ] }}' for a, t in zip(args, types, strict=True))
        + " ]\noutput [ "
        + ", ".join(f'{{ name: "OUT_{t}__{i}" data_type: TYPE_{t} dims: [ 3 ] }}' for i, t in enumerate(types))
        + " ]\n",
        {1: tm.AllTypes()},
    )
    _write(
        root,
        "spin",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 0
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 48, 48 ] }, { name: "rounds" data_type: TYPE_INT64 dims: [ 1 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 48, 48 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }
        """,
        {1: tm.Spin()},
    )
    _write(
        root,
        "words",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 0
        input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
        """,
        {1: tm.Words()},
    )
    exported = root / "exported"
    _write(
        root,
        "exported",
        TUTORIAL_CONFIG.replace('"resnet_classifier"', '"{name}"')
        .replace("INPUT__0", "x")
        .replace('platform: "pytorch_libtorch"', 'platform: "pytorch_libtorch"\ndefault_model_filename: "model.pt2"'),
    )
    tm.save_exported(classifiers[2], (torch.zeros(2, 3, 16, 16),), exported / "1" / "model.pt2", max_batch=16)
    _write(
        root,
        "wrong_output_type",
        """
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 0
        input [ { name: "INPUT__0" data_type: TYPE_FP16 dims: [ 2 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP16 dims: [ 2 ] } ]
        """,
        {1: tm.WrongDtype()},
    )
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    srv = start_server(repo, log_dir=repo.parent)
    yield srv
    srv.terminate()


def _client(server: ServerProcess, protocol: str):  # type: ignore[no-untyped-def]
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _infer(
    module, client, model, arrays: dict[str, np.ndarray], datatypes: dict[str, str], version: str = "", outputs=None
):  # type: ignore[no-untyped-def]
    inputs = []
    for name, array in arrays.items():
        inp = module.InferInput(name, list(array.shape), datatypes[name])
        if module is httpclient:
            inp.set_data_from_numpy(array, binary_data=True)
        else:
            inp.set_data_from_numpy(array)
        inputs.append(inp)
    requested = [module.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, inputs, model_version=version, outputs=requested)


def _images(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tutorial_config_serves_the_latest_version_like_triton(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    images = _images(3)
    result = _infer(module, client, "resnet_classifier", {"INPUT__0": images}, {"INPUT__0": "FP32"})
    expected = tm.run(tm.classifier(SEEDS[2]), images)[0]
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected, rtol=1e-5, atol=1e-5)
    assert client.is_model_ready("resnet_classifier", "2")
    assert not client.is_model_ready("resnet_classifier", "1")  # default version_policy: latest 1
    metadata = client.get_model_metadata("resnet_classifier")
    platform = metadata["platform"] if isinstance(metadata, dict) else metadata.platform
    assert platform == "pytorch_libtorch"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_versions_one_and_two_each_equal_their_own_module(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    images = _images(5, seed=1)
    outputs = {}
    for version, seed in SEEDS.items():
        result = _infer(
            module, client, "resnet_all_versions", {"INPUT__0": images}, {"INPUT__0": "FP32"}, version=str(version)
        )
        outputs[version] = result.as_numpy("OUTPUT__0")
        np.testing.assert_allclose(outputs[version], tm.run(tm.classifier(seed), images)[0], rtol=1e-5, atol=1e-5)
    assert not np.allclose(outputs[1], outputs[2])  # two different models, not one served twice


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_bind_by_forward_argument_name(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    image = np.arange(8, dtype=np.float32).reshape(2, 4)
    scale = np.array([[2.0], [-1.0]], dtype=np.float32)
    result = _infer(module, client, "named", {"scale": scale, "image": image}, {"scale": "FP32", "image": "FP32"})
    scaled, total = tm.run(tm.Named(), image, scale)
    np.testing.assert_array_equal(result.as_numpy("scaled__0"), scaled)
    np.testing.assert_array_equal(result.as_numpy("total__1"), total)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tuple_results_bind_by_index_and_subsets_can_be_requested(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    a = np.array([[1, 2, 3]], dtype=np.float32)
    b = np.array([[10, 20, 30]], dtype=np.float32)
    result = _infer(module, client, "pair", {"A__0": a, "B__1": b}, {"A__0": "FP32", "B__1": "FP32"})
    np.testing.assert_array_equal(result.as_numpy("SUM__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFFERENCE__1"), a - b)
    np.testing.assert_array_equal(result.as_numpy("PRODUCT__2"), a * b)
    only = _infer(
        module, client, "pair", {"A__0": a, "B__1": b}, {"A__0": "FP32", "B__1": "FP32"}, outputs=["PRODUCT__2"]
    )
    np.testing.assert_array_equal(only.as_numpy("PRODUCT__2"), a * b)
    assert only.as_numpy("SUM__0") is None


def test_names_without_convention_bind_in_config_order(server: ServerProcess) -> None:
    _, client = _client(server, "http")
    first = np.array([5, 6, 7], dtype=np.float32)
    second = np.array([1, 1, 1], dtype=np.float32)
    result = _infer(
        httpclient, client, "pair_ordered", {"second": second, "first": first}, {"first": "FP32", "second": "FP32"}
    )
    np.testing.assert_array_equal(result.as_numpy("plus"), first + second)
    np.testing.assert_array_equal(result.as_numpy("minus"), first - second)
    assert "do not follow the <name>__<index> naming convention" in server.log()


def test_list_results_and_dict_inputs(server: ServerProcess) -> None:
    _, client = _client(server, "grpc")
    x = np.array([[1, 2], [3, 4]], dtype=np.int32)
    result = _infer(grpcclient, client, "list_result", {"INPUT__0": x}, {"INPUT__0": "INT32"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), x * 2)
    left = np.array([[1, 2]], dtype=np.int64)
    right = np.array([[3, 4]], dtype=np.int64)
    result = _infer(
        grpcclient, client, "dict_input", {"left": left, "right": right}, {"left": "INT64", "right": "INT64"}
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), left * 10 + right)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_data_type_round_trips(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    rng = np.random.default_rng(3)
    arrays = {
        "f16": rng.standard_normal((2, 3)).astype(np.float16),
        "bf16": np.array(rng.standard_normal((2, 3)), dtype=ml_dtypes.bfloat16),
        "i8": rng.integers(-100, 100, (2, 3)).astype(np.int8),
        "i16": rng.integers(-1000, 1000, (2, 3)).astype(np.int16),
        "i32": rng.integers(-(2**30), 2**30, (2, 3)).astype(np.int32),
        "i64": rng.integers(-(2**40), 2**40, (2, 3)).astype(np.int64),
        "flag": rng.integers(0, 2, (2, 3)).astype(bool),
        "u8": rng.integers(0, 255, (2, 3)).astype(np.uint8),
        "f64": rng.standard_normal((2, 3)),
    }
    wire = {
        "f16": "FP16",
        "bf16": "BF16",
        "i8": "INT8",
        "i16": "INT16",
        "i32": "INT32",
        "i64": "INT64",
        "flag": "BOOL",
        "u8": "UINT8",
        "f64": "FP64",
    }
    result = _infer(module, client, "all_types", arrays, wire)
    torch_inputs = [
        torch.from_numpy(arrays[k].view(np.int16)).view(torch.bfloat16) if k == "bf16" else torch.from_numpy(arrays[k])
        for k in wire
    ]
    with torch.inference_mode():
        expected = tm.AllTypes()(*torch_inputs)
    for i, (key, datatype) in enumerate(wire.items()):
        got = result.as_numpy(f"OUT_{datatype}__{i}")
        want = expected[i]
        if datatype == "BF16":
            assert got.dtype == ml_dtypes.bfloat16, key
            np.testing.assert_array_equal(got.view(np.int16), want.view(torch.int16).numpy())
        else:
            assert got.dtype == want.numpy().dtype, key
            np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_strings_travel_as_lists(server: ServerProcess, protocol: str) -> None:
    module, client = _client(server, protocol)
    words = np.array([b"alpha", "b\u00e9ta".encode(), b""], dtype=object)
    result = _infer(module, client, "words", {"INPUT__0": words}, {"INPUT__0": "BYTES"})
    expected = torch.jit.script(tm.Words())([w.decode() for w in words])  # TorchScript's upper() is ASCII-only
    assert result.as_numpy("OUTPUT__0").tolist() == [w.encode() for w in expected]
    assert expected[0] == "ALPHA!"


def test_exported_program_in_model_pt2_is_served(server: ServerProcess) -> None:
    _, client = _client(server, "http")
    images = _images(7, seed=4)
    result = _infer(httpclient, client, "exported", {"x": images}, {"x": "FP32"})
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT__0"), tm.run(tm.classifier(SEEDS[2]), images)[0], rtol=1e-5, atol=1e-5
    )


def test_concurrent_requests_form_one_batch(server: ServerProcess) -> None:
    """Four concurrent requests reach preferred_batch_size 4 inside the 3 s window: one execution of 4."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    try:
        images = [_images(1, seed=10 + i) for i in range(4)]
        pending = []
        for image in images:
            inp = httpclient.InferInput("INPUT__0", [1, 3, 16, 16], "FP32")
            inp.set_data_from_numpy(image)
            pending.append(client.async_infer("batched", [inp]))
        results = [p.get_result().as_numpy("OUTPUT__0") for p in pending]
    finally:
        client.close()
    reference = tm.classifier(SEEDS[1])
    for image, got in zip(images, results, strict=True):
        np.testing.assert_allclose(got, tm.run(reference, image)[0], rtol=1e-5, atol=1e-5)
    stats = httpx.get(f"{server.base_url}/v2/models/batched/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_count"] == 4
    assert stats["execution_count"] < 4, stats
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert max(sizes) > 1, sizes
    assert sum(size * count for size, count in sizes.items()) == 4


def _running_threads(pid: int) -> set[int]:
    running = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "R":
            running.add(int(task))
    return running


def test_two_instances_execute_at_the_same_time(server: ServerProcess) -> None:
    """Two long forwards on the two instances: two server threads are seen running (state R) at once.

    With the GIL held during forward, the second instance's thread would wait on the GIL (state S)
    until the first finished; one intra-op thread per instance keeps other compute threads out.
    """
    x = np.full((48, 48), 0.01, dtype=np.float32)
    rounds = np.array([SPIN_ROUNDS], dtype=np.int64)

    def call(_: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600, connection_timeout=600)
        try:
            return _infer(
                httpclient, client, "spin", {"x": x, "rounds": rounds}, {"x": "FP32", "rounds": "INT64"}
            ).as_numpy("OUTPUT__0")
        finally:
            client.close()

    both_seen = 0
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(call, i) for i in range(2)]
        while not all(f.done() for f in futures):
            if len(_running_threads(server.proc.pid)) >= 2:
                both_seen += 1
            time.sleep(0.02)
        results = [f.result() for f in futures]
    expected = tm.run(tm.Spin(), x, rounds)[0]
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    stats = httpx.get(f"{server.base_url}/v2/models/spin/stats", timeout=10).json()["model_stats"][0]
    assert stats["execution_count"] == 2
    assert both_seen >= 3, f"two server threads were running together in only {both_seen} samples"


def test_output_type_mismatch_fails_the_request_with_the_reason(server: ServerProcess) -> None:
    _, client = _client(server, "http")
    with pytest.raises(InferenceServerException) as info:
        _infer(
            httpclient, client, "wrong_output_type", {"INPUT__0": np.ones(2, dtype=np.float16)}, {"INPUT__0": "FP16"}
        )
    assert info.value.status() == "400"
    assert (
        "configuration expects datatype TYPE_FP16 for output 'OUTPUT__0', model provides TYPE_FP32"
        in info.value.message()
    )
    assert client.is_server_live() and client.is_model_ready("pair")
