"""``az://`` sources through the operator's writer against a real Azure Blob Storage (Microsoft's emulator Azurite,
uploaded to with azure-storage-blob): a blob pinned by the spec's sha256 becomes the model file, with the account
key (a read-and-list SAS signed locally) or a SAS token from the Secret; a folder model's archive is unpacked; a
prefix is listed page by page, and without blob versioning (Azurite has none) a folder is refused, since nothing
pins its blobs; a wrong key, a missing container or blob, and a refused endpoint are conditions that say so and
name no secret.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobSasPermissions, generate_blob_sas
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.azure import AzureBlobSource, credential_from
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.uris import parse_az

from tests.support.azurite import Azurite
from tests.support.sources import (
    LOOPBACK,
    NS,
    files_in,
    make_writer,
    model_spec,
    relu_onnx,
    secret_lookup,
    volume_root,
)

WRONG_KEY = "AAAA" + Azurite.key[4:]


def _secret(azurite: Azurite, data: dict[str, str]) -> Any:
    return secret_lookup(data, azurite.host)


def _key(azurite: Azurite, key: str | None = None) -> Fetch:
    return Fetch(_secret(azurite, {"AZURE_STORAGE_KEY": key or azurite.key}))


def _source(azurite: Azurite, path: str, **more: Any) -> dict[str, Any]:
    return {"uri": f"az://{azurite.account}/{path}", "endpoint": azurite.endpoint, "credentialsSecret": "az", **more}


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    with Azurite(tmp_path_factory.mktemp("azurite")) as store:
        store.service().create_container("models")
        yield store


@pytest.fixture
def model_bytes(tmp_path: Path) -> bytes:
    return relu_onnx(tmp_path / "relu.onnx").read_bytes()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return volume_root(tmp_path)


def _upload(azurite: Azurite, name: str, data: bytes, container: str = "models") -> None:
    azurite.service().get_blob_client(container, name).upload_blob(data, overwrite=True)


def test_a_blob_pinned_by_sha256_with_the_account_key(root: Path, azurite: Azurite, model_bytes: bytes) -> None:
    _upload(azurite, "plain/model.onnx", model_bytes)
    # one ranged GET: Azurite is near, so the stream stays alone (parts of 1000 bytes only if it were slow)
    writer = make_writer(root, part_size=1000, parallel=4)
    server_dir = writer.server_dir(NS, "ns/pool")
    digest = hashlib.sha256(model_bytes).hexdigest()
    fetch = _key(azurite)
    writer.sync_model(
        server_dir,
        render_model("a", model_spec(_source(azurite, "models/plain/model.onnx", sha256=digest))),
        fetch=fetch,
    )
    assert (server_dir / "a/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"sha256 sha256:{digest}"}
    assert read_model(server_dir, "a").error == ""
    # nothing pins it (no versioning): refused before a byte is written
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            server_dir, render_model("c", model_spec(_source(azurite, "models/plain/model.onnx"))), fetch=_key(azurite)
        )
    assert info.value.reason == "ChecksumRequired" and "versioning" in info.value.message
    assert not (server_dir / "c").exists()
    # a wrong sha256: the bytes are refused, nothing is published
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(_source(azurite, "models/plain/model.onnx", sha256="0" * 64))
        writer.sync_model(server_dir, render_model("d", spec), fetch=_key(azurite))
    assert info.value.reason == "ChecksumMismatch" and not (server_dir / "d").exists()


def test_a_sas_token_from_the_secret(root: Path, azurite: Azurite, model_bytes: bytes) -> None:
    _upload(azurite, "sas/model.onnx", model_bytes)
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    sas = generate_blob_sas(
        azurite.account, "models", "sas/model.onnx", account_key=azurite.key,
        permission=BlobSasPermissions(read=True), expiry=expiry,
    )  # fmt: skip
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    digest = hashlib.sha256(model_bytes).hexdigest()
    fetch = Fetch(_secret(azurite, {"sasToken": "?" + sas}))
    spec = model_spec(_source(azurite, "models/sas/model.onnx", sha256=digest))
    writer.sync_model(server_dir, render_model("s", spec), fetch=fetch)
    assert (server_dir / "s/1/model.onnx").read_bytes() == model_bytes
    # the blob's SAS reads that blob only: another one is refused, and the message shows no signature
    _upload(azurite, "sas/other.onnx", model_bytes)
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(_source(azurite, "models/sas/other.onnx", sha256=digest))
        writer.sync_model(server_dir, render_model("o", spec), fetch=Fetch(_secret(azurite, {"sasToken": sas})))
    assert info.value.reason == "SourceUnauthorized" and "AuthorizationFailure" in info.value.message
    assert "sig" not in info.value.message and sas not in info.value.message


def test_a_folder_models_archive_is_unpacked(root: Path, azurite: Azurite) -> None:
    files = {"saved_model.pb": b"graph", "variables/variables.index": b"index", "variables/variables.data": b"w" * 999}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _upload(azurite, "saved.tar.gz", buffer.getvalue())
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = model_spec(
        _source(azurite, "models/saved.tar.gz", sha256=hashlib.sha256(buffer.getvalue()).hexdigest()),
        "tensorflow_savedmodel",
    )
    writer.sync_model(server_dir, render_model("tf", spec), fetch=_key(azurite))
    folder = server_dir / "tf/1/model.savedmodel"
    assert files_in(folder) == files


def test_a_prefix_is_listed_by_pages_and_unpinned_blobs_are_refused(root: Path, azurite: Azurite) -> None:
    names = [f"saved/1/variables/part-{i:02}" for i in range(5)] + ["saved/1/saved_model.pb"]
    for name in names:
        _upload(azurite, name, name.encode())
    _upload(azurite, "saved/10/other", b"not under saved/1/")
    client = StoreClient(LOOPBACK, timeout=10.0)
    try:
        key = credential_from({"accountKey": azurite.key})
        source = AzureBlobSource(client, parse_az("az://devstoreaccount1/models/saved/1/"), NS,
                                 endpoint=azurite.endpoint, credential=key)  # fmt: skip
        source.page_size = 2  # three pages, each after the last one's NextMarker
        listed = source.list_folder(100)
        assert sorted(b.name for b in listed) == sorted(names)
        assert all(b.size == len(b.name) and b.etag and b.content_md5 for b in listed)
        with pytest.raises(Exception) as too_many:
            source.list_folder(4)
        assert getattr(too_many.value, "reason", "") == "SourceTooLarge"
    finally:
        client.close()
    # through the writer: Azurite keeps no versions, so nothing pins a folder's blobs
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(_source(azurite, "models/saved/1/"), "tensorflow_savedmodel")
        writer.sync_model(server_dir, render_model("tf", spec), fetch=_key(azurite))
    assert info.value.reason == "ChecksumRequired"
    assert not (server_dir / "tf").exists()
    # a sha256 pins one blob, not a folder
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(_source(azurite, "models/saved/1/", sha256="0" * 64), "tensorflow_savedmodel")
        writer.sync_model(server_dir, render_model("tf", spec), fetch=_key(azurite))
    assert info.value.reason == "SourceInvalid"
    # the size limit holds from the listing, before the first byte
    small = make_writer(root, deadline=60.0, max_bytes=50)
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(_source(azurite, "models/saved/1/"), "tensorflow_savedmodel")
        small.sync_model(server_dir, render_model("tf", spec), fetch=_key(azurite))
    assert info.value.reason == "SourceTooLarge"


def test_wrong_key_missing_things_and_refused_endpoints_say_so_and_name_no_secret(
    root: Path, azurite: Azurite, model_bytes: bytes
) -> None:
    _upload(azurite, "m/model.onnx", model_bytes)
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    digest = hashlib.sha256(model_bytes).hexdigest()

    def failure(path: str, fetch: Fetch, **more: Any) -> ArtifactError:
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(
                server_dir, render_model("x", model_spec(_source(azurite, path, sha256=digest, **more))), fetch=fetch
            )
        assert not (server_dir / "x/1").exists()
        return info.value

    wrong = failure("models/m/model.onnx", _key(azurite, WRONG_KEY))
    assert wrong.reason == "SourceUnauthorized" and "AuthorizationFailure" in wrong.message
    assert WRONG_KEY not in wrong.message and azurite.key not in wrong.message and "sig=" not in wrong.message
    missing_blob = failure("models/m/nothing.onnx", _key(azurite))
    assert missing_blob.reason == "SourceNotFound" and "BlobNotFound" in missing_blob.message
    missing_container = failure("nocontainer/m/model.onnx", _key(azurite))
    assert missing_container.reason == "SourceNotFound" and "ContainerNotFound" in missing_container.message
    # no credentials: Azurite refuses anonymous reads of a private container
    with pytest.raises(ArtifactError) as info:
        source = {"uri": f"az://{azurite.account}/models/m/model.onnx", "endpoint": azurite.endpoint, "sha256": digest}
        writer.sync_model(server_dir, render_model("x", model_spec(source)), fetch=Fetch())
    assert info.value.reason == "SourceUnauthorized"
    # an endpoint at an address the egress rules refuse: refused before any connection, the Secret never read
    read: list[str] = []

    def lookup(name: str, host: str) -> dict[str, str]:
        read.append(host)
        return {"AZURE_STORAGE_KEY": azurite.key}

    refused = failure("models/m/model.onnx", Fetch(lookup), endpoint="http://10.11.12.13:10000/devstoreaccount1")
    assert refused.reason == "SourceRefused" and read == []
    metadata = failure("models/m/model.onnx", Fetch(lookup), endpoint="http://169.254.169.254/devstoreaccount1")
    assert metadata.reason == "SourceRefused" and read == []
