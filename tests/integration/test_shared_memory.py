"""System shared memory with tritonclient's own helpers, over HTTP and gRPC, and Triton's errors."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.support import models as test_models
from tests.support.repos import write_model
from tests.support.server import ServerProcess, http_transports, start_server

ADD = """
name: "add"
backend: "onnxruntime"
max_batch_size: 8
dynamic_batching { }
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
STRINGS = """
name: "strings"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_STRING dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 4 ] } ]
"""


def _repo(root: Path) -> Path:
    repo = root / "repo"
    write_model(repo, "add", ADD, {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])})
    write_model(repo, "strings", STRINGS, {1: test_models.string_identity()})
    return repo


@pytest.fixture(scope="module", params=http_transports())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = _repo(tmp_path_factory.mktemp("shm"))
    server = start_server(repo, "--allow-client-shm=true", "--http-transport", request.param)
    yield server
    server.terminate()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Any:
    if request.param == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


class Regions:
    """Regions created with tritonclient's helpers, destroyed (and unregistered) at the end."""

    def __init__(self, client: Any) -> None:
        self.client = client
        #: (region name, handle) of every region created
        self.handles: list[tuple[str, Any]] = []
        self.tag = f"{os.getpid()}_{id(self)}"

    def key(self, name: str) -> str:
        """The POSIX shared-memory key of the region ``create(name)`` made."""
        return f"/kubeinfer_test_{self.tag}_{name}"

    def create(self, name: str, byte_size: int, register: bool = True) -> Any:
        key = self.key(name)
        handle = shm.create_shared_memory_region(f"{name}_{self.tag}", key, byte_size)
        self.handles.append((f"{name}_{self.tag}", handle))
        if register:
            self.client.register_system_shared_memory(f"{name}_{self.tag}", key, byte_size)
        return handle

    def name(self, name: str) -> str:
        return f"{name}_{self.tag}"

    def close(self) -> None:
        for name, h in self.handles:
            try:
                self.client.unregister_system_shared_memory(name)
            except InferenceServerException:
                pass
            shm.destroy_shared_memory_region(h)


@pytest.fixture
def regions(client: Any) -> Iterator[Regions]:
    r = Regions(client)
    yield r
    r.close()


def _status_names(client: Any) -> set[str]:
    status = client.get_system_shared_memory_status()
    if isinstance(status, list):  # HTTP: a JSON list
        return {s["name"] for s in status}
    return set(status.regions)


def test_round_trip_inputs_and_output_in_shared_memory(client: Any, regions: Regions) -> None:
    mod = _mod(client)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 10, dtype=np.float32)
    # both inputs in one region, at offset 0 and after A: tritonclient's usual layout
    inp = regions.create("in", a.nbytes + b.nbytes)
    out = regions.create("out", a.nbytes)
    shm.set_shared_memory_region(inp, [a])
    shm.set_shared_memory_region(inp, [b], offset=a.nbytes)
    inputs = [mod.InferInput("A", [2, 4], "FP32"), mod.InferInput("B", [2, 4], "FP32")]
    inputs[0].set_shared_memory(regions.name("in"), a.nbytes)
    inputs[1].set_shared_memory(regions.name("in"), b.nbytes, offset=a.nbytes)
    output = mod.InferRequestedOutput("OUT")
    output.set_shared_memory(regions.name("out"), a.nbytes)
    result = client.infer("add", inputs, outputs=[output])
    meta = result.get_output("OUT")
    shape = meta["shape"] if isinstance(meta, dict) else list(meta.shape)
    datatype = meta["datatype"] if isinstance(meta, dict) else meta.datatype
    assert shape == [2, 4] and datatype == "FP32"
    got = shm.get_contents_as_numpy(out, np.float32, shape)
    np.testing.assert_array_equal(got, a + b)
    assert {regions.name("in"), regions.name("out")} <= _status_names(client)


def test_mixed_inline_and_shared_memory_inputs(client: Any, regions: Regions) -> None:
    """gRPC: raw_input_contents holds only the inputs not in shared memory, in order."""
    mod = _mod(client)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), dtype=np.float32)
    region = regions.create("b", b.nbytes)
    shm.set_shared_memory_region(region, [b])
    inputs = [mod.InferInput("A", [1, 4], "FP32"), mod.InferInput("B", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_shared_memory(regions.name("b"), b.nbytes)
    result = client.infer("add", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), a + b)


def test_bytes_tensors_through_shared_memory(client: Any, regions: Regions) -> None:
    mod = _mod(client)
    words = np.array([[b"alpha", b"", b"g\x00mma", "δέλτα".encode()]], dtype=np.object_)
    # Triton's own client example: the serialized tensor is what goes into the region
    serialized = serialize_byte_tensor(words)
    size = len(serialized.item())
    inp = regions.create("sin", size)
    out = regions.create("sout", size)
    shm.set_shared_memory_region(inp, [serialized])
    tensor = mod.InferInput("IN", [1, 4], "BYTES")
    tensor.set_shared_memory(regions.name("sin"), size)
    output = mod.InferRequestedOutput("OUT")
    output.set_shared_memory(regions.name("sout"), size)
    client.infer("strings", [tensor], outputs=[output])
    got = shm.get_contents_as_numpy(out, np.object_, [1, 4])
    assert got.tolist() == words.tolist()


def _infer_error(client: Any, inputs: list[Any], outputs: list[Any] | None = None) -> str:
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", inputs, outputs=outputs)
    return str(err.value)


def _add_inputs(mod: Any, region: str, byte_size: int = 16, offset: int = 0) -> list[Any]:
    inputs = [mod.InferInput("A", [1, 4], "FP32"), mod.InferInput("B", [1, 4], "FP32")]
    inputs[0].set_shared_memory(region, byte_size, offset=offset)
    inputs[1].set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return inputs


def test_bounds_and_lookup_errors(client: Any, regions: Regions) -> None:
    mod = _mod(client)
    regions.create("small", 32)
    name = regions.name("small")
    assert f"Invalid offset for shared memory region: '{name}'" in _infer_error(
        client, _add_inputs(mod, name, offset=32)
    )
    assert f"Invalid offset + byte size for shared memory region: '{name}'" in _infer_error(
        client, _add_inputs(mod, name, offset=24)
    )
    assert "Unable to find shared memory region: 'never_registered'" in _infer_error(
        client, _add_inputs(mod, "never_registered")
    )
    assert "unexpected total byte size 12 for input 'A', expecting 16" in _infer_error(
        client, _add_inputs(mod, name, byte_size=12)
    )
    # an output region that cannot hold the result: refused with Triton's words, nothing half-written
    regions.create("tiny_out", 8)
    output = mod.InferRequestedOutput("OUT")
    output.set_shared_memory(regions.name("tiny_out"), 8)
    inputs = [mod.InferInput("A", [1, 4], "FP32"), mod.InferInput("B", [1, 4], "FP32")]
    for t in inputs:
        t.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert (
        "shared memory size specified with the request for output 'OUT' (8 bytes) should be at least "
        "16 bytes to hold the results"
    ) in _infer_error(client, inputs, [output])
    # the server keeps serving
    for t in inputs:
        t.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("OUT"), np.full((1, 4), 2, np.float32))


def test_a_region_truncated_after_registration_is_refused_and_the_server_keeps_serving(
    client: Any, regions: Regions, server: ServerProcess
) -> None:
    """Issue 23: a client that truncates its object after registering it used to take the server down with
    SIGBUS (the mapping faulted). Inputs and outputs in such a region are now refused (400 /
    INVALID_ARGUMENT, saying why); the server goes on serving, and the region works again once the object
    is as long as registered."""
    mod = _mod(client)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    inp = regions.create("trunc_in", 4096)
    out = regions.create("trunc_out", 4096)
    shm.set_shared_memory_region(inp, [a])
    files = {n: Path("/dev/shm") / regions.key(f"trunc_{n}").lstrip("/") for n in ("in", "out")}
    output = mod.InferRequestedOutput("OUT")
    output.set_shared_memory(regions.name("trunc_out"), 16)
    client.infer("add", _add_inputs(mod, regions.name("trunc_in")), outputs=[output])  # works while whole
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.float32, [1, 4]), a + 1)

    os.truncate(files["in"], 0)
    message = _infer_error(client, _add_inputs(mod, regions.name("trunc_in")))
    assert f"shared memory region '{regions.name('trunc_in')}'" in message and "was truncated" in message, message
    os.truncate(files["out"], 8)  # shorter than the 16 bytes the output needs
    inputs = [mod.InferInput("A", [1, 4], "FP32"), mod.InferInput("B", [1, 4], "FP32")]
    for t in inputs:
        t.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    message = _infer_error(client, inputs, [output])
    assert f"shared memory region '{regions.name('trunc_out')}'" in message and "was truncated" in message, message
    for request in (
        lambda: client.infer("add", _add_inputs(mod, regions.name("trunc_in"))),
        lambda: client.infer("add", inputs, outputs=[output]),
    ):
        with pytest.raises(InferenceServerException) as info:
            request()
        if isinstance(client, grpcclient.InferenceServerClient):
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        else:
            assert info.value.status() == "400"
    assert server.alive()
    np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("OUT"), np.full((1, 4), 2, np.float32))

    for path in files.values():  # as long as registered again: served again
        os.truncate(path, 4096)
    shm.set_shared_memory_region(inp, [a])
    client.infer("add", _add_inputs(mod, regions.name("trunc_in")), outputs=[output])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out, np.float32, [1, 4]), a + 1)


def test_registration_errors(client: Any, regions: Regions) -> None:
    regions.create("dup", 64)
    key = regions.key("dup")
    with pytest.raises(
        InferenceServerException, match=f"shared memory region '{regions.name('dup')}' already in manager"
    ):
        client.register_system_shared_memory(regions.name("dup"), key, 64)
    with pytest.raises(
        InferenceServerException, match=f"failed to register shared memory region 'too_big_{regions.tag}': invalid args"
    ):
        client.register_system_shared_memory(f"too_big_{regions.tag}", key, 65)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region: '/kubeinfer_no_such_key'"):
        client.register_system_shared_memory("missing", "/kubeinfer_no_such_key", 8)
    with pytest.raises(InferenceServerException, match="invalid key '/../etc/passwd'"):
        client.register_system_shared_memory("escape", "/../etc/passwd", 8)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'nope'"):
        client.get_system_shared_memory_status("nope")
    # unregistering an unknown name succeeds, as with Triton
    client.unregister_system_shared_memory("nope")


def test_unregister_all(client: Any, regions: Regions) -> None:
    regions.create("u1", 16)
    regions.create("u2", 16)
    assert {regions.name("u1"), regions.name("u2")} <= _status_names(client)
    client.unregister_system_shared_memory()
    assert _status_names(client) == set()


def test_cuda_shared_memory_without_a_gpu(client: Any) -> None:
    if isinstance(client, httpclient.InferenceServerClient):
        status = client.get_cuda_shared_memory_status()
        assert status == []
    else:
        assert len(client.get_cuda_shared_memory_status().regions) == 0
    with pytest.raises(InferenceServerException, match="GPUs not supported"):
        # both clients take the handle as cuda_shared_memory.get_raw_handle returns it: base64
        client.register_cuda_shared_memory("gpu_region", base64.b64encode(b"\0" * 64), 0, 16)


def test_disabled_by_default(tmp_path: Path) -> None:
    """Without --allow-client-shm (Triton 26.04+'s default) every shared-memory call is refused."""
    server = start_server(_repo(tmp_path))
    try:
        meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
        assert "system_shared_memory" not in meta["extensions"]
        key = f"/kubeinfer_test_disabled_{os.getpid()}"
        handle = shm.create_shared_memory_region("d", key, 16)
        try:
            for c in (
                httpclient.InferenceServerClient(server.http_url),
                grpcclient.InferenceServerClient(server.grpc_url),
            ):
                with pytest.raises(InferenceServerException, match="start it with --allow-client-shm=true"):
                    c.register_system_shared_memory("d", key, 16)
                assert "start it with --allow-client-shm=true" in _infer_error(c, _add_inputs(_mod(c), "d"))
        finally:
            shm.destroy_shared_memory_region(handle)
    finally:
        server.terminate()
