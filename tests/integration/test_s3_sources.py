"""``s3://`` sources through the operator's writer against a real S3 store (SeaweedFS, uploaded to with boto3):
an object or a prefix becomes the version folder, pinned by the spec's sha256, the object's SHA-256 checksum or
its version; wrong credentials, a missing bucket and an unpinned object are conditions that say so and name no
secret; the size limits hold from the listing, before the first byte; and a store that dies in the middle of a
download and comes back leaves the model Ready with the right bytes.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from kubeinfer.operator.artifacts import ArtifactError
from kubeinfer.operator.fetch import Fetch, Fetcher
from kubeinfer.operator.render import render_model
from kubeinfer.operator.repository_writer import SOURCE_MARKER, RepositoryWriter
from kubeinfer.operator.store_sources import StoreSources
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
from onnx import TensorProto

from tests.support.models import unary
from tests.support.s3_store import S3Store

NS = "ns"
LOOPBACK = AddressPolicy(allowed=parse_networks(["127.0.0.0/8"]))


def _spec(source: dict[str, Any], platform: str = "onnxruntime_onnx") -> dict[str, Any]:
    return {
        "server": "s",
        "platform": platform,
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": [{"version": 1, "source": source}],
    }


def _writer(root: Path, **stores: Any) -> RepositoryWriter:
    fetcher = Fetcher(LOOPBACK)
    client = StoreClient(LOOPBACK, timeout=10.0)
    return RepositoryWriter(root, fetcher=fetcher, stores=StoreSources(client, deadline=300.0, **stores))


def _keys(store: S3Store, identity: str = "reader") -> Any:
    access, secret = store.credentials(identity)

    def lookup(name: str, host: str) -> dict[str, str]:
        if host != store.host:
            raise ArtifactError("CredentialsRejected", f"Secret '{name}' may not be sent to '{host}'")
        return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}

    return lookup


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    with S3Store(tmp_path_factory.mktemp("s3")) as s3:
        s3.client().create_bucket(Bucket="models")
        yield s3


@pytest.fixture
def model_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "relu.onnx"
    onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), path)
    return path.read_bytes()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "volume" / NS).mkdir(parents=True)
    return tmp_path / "volume"


def _source(store: S3Store, key: str, **more: Any) -> dict[str, Any]:
    return {"uri": f"s3://models/{key}", "endpoint": store.endpoint, "credentialsSecret": "s3", **more}


def test_an_object_pinned_by_sha256_checksum_or_version(root: Path, store: S3Store, model_bytes: bytes) -> None:
    s3 = store.client()
    s3.put_object(Bucket="models", Key="plain/model.onnx", Body=model_bytes)
    s3.put_object(Bucket="models", Key="summed/model.onnx", Body=model_bytes, ChecksumAlgorithm="SHA256")
    writer = _writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    digest = hashlib.sha256(model_bytes).hexdigest()
    fetch = Fetch(_keys(store))
    spec = _spec(_source(store, "plain/model.onnx", sha256=digest))
    writer.sync_model(server_dir, render_model("a", spec), fetch=fetch)
    assert (server_dir / "a/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"sha256 sha256:{digest}"}
    assert read_model(server_dir, "a").error == ""
    # the store's own SHA-256 checksum pins it: no sha256 in the spec
    fetch = Fetch(_keys(store))
    writer.sync_model(server_dir, render_model("b", _spec(_source(store, "summed/model.onnx"))), fetch=fetch)
    assert (server_dir / "b/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"s3-checksum sha256:{digest}"}
    # nothing pins it: refused before a byte is written
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            server_dir, render_model("c", _spec(_source(store, "plain/model.onnx"))), fetch=Fetch(_keys(store))
        )
    assert info.value.reason == "ChecksumRequired" and "--checksum-algorithm SHA256" in info.value.message
    assert not (server_dir / "c").exists()
    # a wrong sha256: the bytes are refused, nothing is published
    wrong = _spec(_source(store, "plain/model.onnx", sha256="0" * 64))
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("d", wrong), fetch=Fetch(_keys(store)))
    assert info.value.reason == "ChecksumMismatch" and not (server_dir / "d").exists()


def test_a_versioned_object_is_pinned_by_its_version(root: Path, store: S3Store, model_bytes: bytes) -> None:
    s3 = store.client()
    s3.create_bucket(Bucket="versioned")
    s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    version = s3.put_object(Bucket="versioned", Key="m/model.onnx", Body=model_bytes)["VersionId"]
    writer = _writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch(_keys(store))
    source = {"uri": "s3://versioned/m/model.onnx", "endpoint": store.endpoint, "credentialsSecret": "s3"}
    writer.sync_model(server_dir, render_model("v", _spec(source)), fetch=fetch)
    assert fetch.served == {1: f"s3-version {version}"}
    assert (server_dir / "v/1/model.onnx").read_bytes() == model_bytes


def test_a_prefix_becomes_the_version_folder(root: Path, store: S3Store) -> None:
    s3 = store.client()
    files = {"saved_model.pb": b"graph", "variables/variables.index": b"index", "variables/variables.data": b"w" * 9999}
    for rel, data in files.items():
        s3.put_object(Bucket="models", Key=f"saved/1/{rel}", Body=data, ChecksumAlgorithm="SHA256")
    s3.put_object(Bucket="models", Key="saved/1/", Body=b"")  # a console's folder marker: skipped
    writer = _writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch(_keys(store))
    writer.sync_model(
        server_dir, render_model("tf", _spec(_source(store, "saved/1/"), "tensorflow_savedmodel")), fetch=fetch
    )
    folder = server_dir / "tf/1/model.savedmodel"
    assert {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == files
    assert fetch.served == {1: "3 objects pinned by s3-checksum"}
    assert sorted(os.listdir(server_dir / "tf/1")) == sorted([SOURCE_MARKER, "model.savedmodel"])
    # a folder is pinned by its objects: a sha256 for it is refused
    with pytest.raises(ArtifactError) as info:
        spec = _spec(_source(store, "saved/1/", sha256="0" * 64), "tensorflow_savedmodel")
        writer.sync_model(server_dir, render_model("tf2", spec), fetch=Fetch(_keys(store)))
    assert info.value.reason == "SourceInvalid"


def test_limits_hold_from_the_listing_before_the_first_byte(root: Path, store: S3Store) -> None:
    s3 = store.client()
    for i in range(12):
        s3.put_object(Bucket="models", Key=f"many/1/f{i:02}", Body=b"x" * 1000, ChecksumAlgorithm="SHA256")
    writer = _writer(root, max_files=10)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = _spec(_source(store, "many/1/"), "tensorflow_savedmodel")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("many", spec), fetch=Fetch(_keys(store)))
    assert info.value.reason == "SourceTooLarge" and "more than 10 objects" in info.value.message
    small = RepositoryWriter(root, fetcher=Fetcher(LOOPBACK), max_bytes=5000)
    with pytest.raises(ArtifactError) as info:
        small.sync_model(server_dir, render_model("many", spec), fetch=Fetch(_keys(store)))
    assert info.value.reason == "SourceTooLarge" and "12000 bytes" in info.value.message
    assert not list((root / NS).rglob("f0*"))


def test_wrong_credentials_and_missing_things_say_so_and_name_no_secret(
    root: Path, store: S3Store, model_bytes: bytes
) -> None:
    store.client().put_object(Bucket="models", Key="auth/model.onnx", Body=model_bytes, ChecksumAlgorithm="SHA256")
    writer = _writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    access, _ = store.credentials("reader")
    bad_secret = "not-the-secret-" + "x" * 20

    def wrong(name: str, host: str) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": bad_secret}

    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("w", _spec(_source(store, "auth/model.onnx"))), fetch=Fetch(wrong))
    assert info.value.reason == "SourceUnauthorized"
    assert "SignatureDoesNotMatch" in info.value.message or "AccessDenied" in info.value.message
    assert bad_secret not in info.value.message and access not in info.value.message
    for uri, reason in (
        ("s3://nosuchbucket/m.onnx", "SourceNotFound"),
        ("s3://models/auth/none.onnx", "SourceNotFound"),
    ):
        source = {"uri": uri, "endpoint": store.endpoint, "credentialsSecret": "s3", "sha256": "0" * 64}
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model("n", _spec(source)), fetch=Fetch(_keys(store)))
        assert info.value.reason == reason, info.value.message
    assert not (server_dir / "w").exists() and not (server_dir / "n").exists()


def test_a_store_that_dies_mid_download_and_comes_back(root: Path, tmp_path: Path) -> None:
    """The drill: the store is killed while parts are in flight and started again; the broken parts resume
    from the byte they reached, and the version ends with the right bytes."""
    payload = os.urandom(48 << 20)
    with S3Store(tmp_path / "dying") as dying:
        s3 = dying.client()
        s3.create_bucket(Bucket="big")
        s3.put_object(Bucket="big", Key="model.pt", Body=payload, ChecksumAlgorithm="SHA256")
        writer = _writer(root, part_size=4 << 20, parallel=2)
        server_dir = writer.server_dir(NS, "ns/pool")
        received = [0]
        killed = threading.Event()
        restarted = threading.Event()

        def kill_then_restart() -> None:
            dying.stop()
            time.sleep(1.0)
            dying.start()
            restarted.set()

        def count(namespace: str, n: int) -> None:
            received[0] += n
            if received[0] > (8 << 20) and not killed.is_set():
                killed.set()
                threading.Thread(target=kill_then_restart, daemon=True).start()

        fetch = Fetch(_keys(dying))
        fetch.count = count  # type: ignore[method-assign]
        source = {"uri": "s3://big/model.pt", "endpoint": dying.endpoint, "credentialsSecret": "s3"}
        # a TorchScript file is not parsed at render (an ONNX one would be): the bytes may be random
        writer.sync_model(server_dir, render_model("big", _spec(source, "pytorch_libtorch")), fetch=fetch)
        assert restarted.is_set()
        written = (server_dir / "big/1/model.pt").read_bytes()
        assert hashlib.sha256(written).digest() == hashlib.sha256(payload).digest()
