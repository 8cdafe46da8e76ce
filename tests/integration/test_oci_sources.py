"""``oci://`` sources through the operator's writer against a real registry (CNCF distribution, pushed to by the
real ``oras`` CLI): ORAS artifacts and modelcar images become version folders the server reads, pinned by their
digests; a registry that wants credentials gets them only from a labelled Secret for its host, over TLS; a
layer whose bytes do not match its digest writes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
from kubeinfer.server.sources.errors import CHECKSUM_MISMATCH, SourceError
from kubeinfer.server.sources.oci import OciSource
from kubeinfer.server.sources.transfer import Limits, RangeAnswer, RemoteFile, download
from kubeinfer.server.sources.uris import parse_oci

from tests.support.oci_registry import OciRegistry
from tests.support.sources import NS, make_writer, model_spec, names_in, relu_onnx, secret_lookup, volume_root


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return relu_onnx(tmp_path / "relu.onnx")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return volume_root(tmp_path)


@pytest.fixture(scope="module")
def open_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """A registry without auth, over plain http (``source.endpoint: http://...``)."""
    with OciRegistry(tmp_path_factory.mktemp("open-registry"), anonymous_read=True) as registry:
        yield registry


@pytest.fixture(scope="module")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """A registry that wants credentials, over TLS (a test CA the operator is given, --fetch-ca-file)."""
    with OciRegistry(tmp_path_factory.mktemp("private-registry"), tls=True) as registry:
        yield registry


def test_an_oras_artifact_becomes_the_version_folder_pinned_by_its_digest(
    root: Path, open_registry: OciRegistry, model_file: Path
) -> None:
    digest = open_registry.push_artifact("models/relu", "v1", {"model.onnx": model_file})
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch()
    source = {"uri": f"oci://{open_registry.address}/models/relu:v1", "endpoint": open_registry.url}
    result = writer.sync_model(server_dir, render_model("m", model_spec(source)), fetch=fetch)
    assert result.added_versions == [1]
    assert (server_dir / "m/1/model.onnx").read_bytes() == model_file.read_bytes()
    assert fetch.served == {1: f"oci-digest {digest}"}
    assert read_model(server_dir, "m").error == ""
    # pinned by the manifest digest: the same bytes; a digest the registry does not hold is SourceNotFound
    pinned = {"uri": f"oci://{open_registry.address}/models/relu@{digest}", "endpoint": open_registry.url}
    writer.sync_model(server_dir, render_model("p", model_spec(pinned)), fetch=Fetch())
    assert (server_dir / "p/1/model.onnx").read_bytes() == model_file.read_bytes()
    missing = {"uri": f"oci://{open_registry.address}/models/relu@sha256:{'0' * 64}", "endpoint": open_registry.url}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("q", model_spec(missing)), fetch=Fetch())
    assert info.value.reason == "SourceNotFound" and "MANIFEST_UNKNOWN" in info.value.message
    assert not (server_dir / "q").exists()


def test_an_artifact_of_several_files_keeps_their_paths(root: Path, open_registry: OciRegistry, tmp_path: Path) -> None:
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"graph")
    (tmp_path / "saved" / "vars.data").write_bytes(b"weights" * 100)
    open_registry.push_artifact(
        "models/saved",
        "v1",
        {"saved_model.pb": tmp_path / "saved/saved_model.pb", "variables/vars.data": tmp_path / "saved/vars.data"},
    )
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": f"oci://{open_registry.address}/models/saved:v1", "endpoint": open_registry.url}
    writer.sync_model(server_dir, render_model("tf", model_spec(source, "tensorflow_savedmodel")), fetch=Fetch())
    assert names_in(server_dir / "tf/1") == [
        SOURCE_MARKER,
        "model.savedmodel/saved_model.pb",
        "model.savedmodel/variables/vars.data",
    ]


def test_a_modelcar_image_is_unpacked_from_its_models_folder(
    root: Path, open_registry: OciRegistry, model_file: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "car"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(model_file.read_bytes())
    digest = open_registry.push_modelcar("models/car", "v1", folder)
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch()
    source = {"uri": f"oci://{open_registry.address}/models/car:v1", "endpoint": open_registry.url}
    writer.sync_model(server_dir, render_model("car", model_spec(source)), fetch=fetch)
    assert (server_dir / "car/1/model.onnx").read_bytes() == model_file.read_bytes()
    assert fetch.served[1] == f"oci-digest {digest}"
    assert read_model(server_dir, "car").error == ""


def test_a_layer_that_does_not_match_its_digest_writes_nothing(
    root: Path, open_registry: OciRegistry, tmp_path: Path
) -> None:
    payload = tmp_path / "model.onnx"
    payload.write_bytes(b"unique bytes for this test " * 4096)
    open_registry.push_artifact("models/corrupt", "v1", {"model.onnx": payload})
    open_registry.corrupt_blob("sha256:" + hashlib.sha256(payload.read_bytes()).hexdigest())
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": f"oci://{open_registry.address}/models/corrupt:v1", "endpoint": open_registry.url}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("c", model_spec(source)), fetch=Fetch())
    assert info.value.reason == "ChecksumMismatch"
    assert not (server_dir / "c").exists()
    assert not [p for p in server_dir.parent.rglob("*") if "model.onnx" in p.name]


def test_registry_credentials_come_from_the_secret_and_a_wrong_one_is_unauthorized(
    root: Path, private_registry: OciRegistry, model_file: Path
) -> None:
    private_registry.push_artifact("models/private", "v1", {"model.onnx": model_file})
    assert private_registry.ca_file is not None and private_registry.password is not None
    writer = make_writer(root, ca_file=private_registry.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    uri = f"oci://{private_registry.address}/models/private:v1"
    # no Secret: the registry's challenge is answered with nothing
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("a", model_spec({"uri": uri})), fetch=Fetch())
    assert info.value.reason == "SourceUnauthorized"
    # a wrong password: refused, and the password appears in no message
    wrong = Fetch(secret_lookup({"username": str(private_registry.user), "password": "nope-123"}, "127.0.0.1"))
    spec = model_spec({"uri": uri, "credentialsSecret": "registry"})
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("b", spec), fetch=wrong)
    assert info.value.reason == "SourceUnauthorized" and "nope-123" not in info.value.message
    right = {"username": str(private_registry.user), "password": private_registry.password}
    writer.sync_model(server_dir, render_model("c", spec), fetch=Fetch(secret_lookup(right, "127.0.0.1")))
    assert (server_dir / "c/1/model.onnx").read_bytes() == model_file.read_bytes()
    # an image pull Secret (kubernetes.io/dockerconfigjson) works as well
    pull = {".dockerconfigjson": private_registry.dockerconfigjson()}
    writer.sync_model(server_dir, render_model("e", spec), fetch=Fetch(secret_lookup(pull, "127.0.0.1")))
    assert (server_dir / "e/1/model.onnx").read_bytes() == model_file.read_bytes()
    # a Secret whose hosts do not include the registry is not used
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("d", spec), fetch=Fetch(secret_lookup(right, "other.example")))
    assert info.value.reason == "CredentialsRejected"


def test_a_registry_at_a_refused_address_is_never_contacted(root: Path, open_registry: OciRegistry) -> None:
    writer = make_writer(root, policy=AddressPolicy())  # public addresses only
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": f"oci://{open_registry.address}/models/relu:v1", "endpoint": open_registry.url}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", model_spec(source)), fetch=Fetch())
    assert info.value.reason == "SourceRefused" and "loopback" in info.value.message
    assert writer.stores.client.backend.connected == []


def test_a_layer_split_into_parallel_parts_is_read_by_ranges_and_checked(
    open_registry: OciRegistry, tmp_path: Path
) -> None:
    """The downloader's slow-store path against the real registry: the first stream is ended by the probe and
    the rest of the layer comes as ranged parts (206 answers from mid-blob offsets), checked against its digest."""
    blob = tmp_path / "model.bin"
    blob.write_bytes(os.urandom(3 << 20))
    open_registry.push_artifact("models/split", "v1", {"model.bin": blob})
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.0/8"])))
    source = OciSource(client, parse_oci(f"oci://{open_registry.address}/models/split:v1"), NS, plain_http=True)
    (file,) = source.files(10, 1 << 30)
    asked: list[tuple[int, int]] = []

    class Recorded:
        @contextlib.contextmanager
        def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
            asked.append((start, end))
            with source.read_range(file, start, end) as answer:
                yield answer

    # a probe at the first chunk that finds any stream slow and idle: always split
    split = Limits(1 << 30, time.monotonic() + 60, part_size=256 << 10, parallel=4, probe_seconds=0.0)
    split.fast_stream = split.busy_share = float("inf")
    out = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        got = download(Recorded(), file, out, split, "layer")
        assert os.pread(out, (3 << 20) + 1, 0) == blob.read_bytes()
    finally:
        os.close(out)
    assert got == hashlib.sha256(blob.read_bytes()).hexdigest() == file.sha256
    first, *parts = asked
    assert first == (0, (3 << 20) - 1) and len(parts) > 4, asked
    assert 0 < min(parts)[0] and max(parts)[1] == (3 << 20) - 1, asked
    # the same layer with a pin it does not match: refused after the parts
    wrong = dataclasses.replace(file, sha256="0" * 64)
    out = os.open(tmp_path / "out2", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with pytest.raises(SourceError) as info:
            download(source, wrong, out, split, "layer")
    finally:
        os.close(out)
    assert info.value.reason == CHECKSUM_MISMATCH
