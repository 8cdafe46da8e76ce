"""The tests' OCI registry (tests/support/oci_registry.py): the real CNCF distribution registry and pushes with the
real ORAS CLI, checked through the registry's HTTP API v2 with a plain HTTP client."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import httpx
import pytest

from tests.support.oci_registry import OCI_LAYER_TAR_GZIP, OCI_MANIFEST, TITLE, OciRegistry

ACCEPT = {"Accept": OCI_MANIFEST}


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def two_files(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text('name: "simple"\nbackend: "onnxruntime"\n')
    (folder / "model.onnx").write_bytes(os.urandom(70_000))  # unique bytes: no other test shares its blob
    return {"config.pbtxt": folder / "config.pbtxt", "1/model.onnx": folder / "model.onnx"}


def manifest(registry: OciRegistry, repo: str, reference: str) -> httpx.Response:
    r = httpx.get(f"{registry.url}/v2/{repo}/manifests/{reference}", headers=ACCEPT, auth=registry.auth)
    assert r.status_code == 200, r.text
    return r


def blob(registry: OciRegistry, repo: str, digest: str) -> httpx.Response:
    r = httpx.get(f"{registry.url}/v2/{repo}/blobs/{digest}", auth=registry.auth, follow_redirects=True)
    assert r.status_code == 200, r.text
    return r


def test_v2_asks_for_basic_credentials(oci_registry: OciRegistry) -> None:
    r = httpx.get(f"{oci_registry.url}/v2/")
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Basic realm=")
    assert r.headers["docker-distribution-api-version"] == "registry/2.0"
    assert httpx.get(f"{oci_registry.url}/v2/", auth=(str(oci_registry.user), "wrong")).status_code == 401
    assert httpx.get(f"{oci_registry.url}/v2/", auth=oci_registry.auth).status_code == 200


def test_artifact_of_two_files(oci_registry: OciRegistry, tmp_path: Path) -> None:
    files = two_files(tmp_path)
    digest = oci_registry.push_artifact("models/simple", "v1", files, artifact_type="application/vnd.test.model.v1")
    r = manifest(oci_registry, "models/simple", "v1")
    assert r.headers["content-type"] == OCI_MANIFEST
    assert r.headers["docker-content-digest"] == digest == sha256(r.content)
    body = r.json()
    assert body["mediaType"] == OCI_MANIFEST
    assert body["artifactType"] == "application/vnd.test.model.v1"
    layers = body["layers"]
    assert [layer["annotations"][TITLE] for layer in layers] == list(files)
    for layer, path in zip(layers, files.values(), strict=True):
        data = path.read_bytes()
        assert (layer["digest"], layer["size"]) == (sha256(data), len(data))
        got = blob(oci_registry, "models/simple", layer["digest"])
        assert sha256(got.content) == layer["digest"]
        assert got.headers["docker-content-digest"] == layer["digest"]
    # by digest too, and a HEAD answers the digest without the body
    assert manifest(oci_registry, "models/simple", digest).content == r.content
    head = httpx.head(f"{oci_registry.url}/v2/models/simple/manifests/v1", headers=ACCEPT, auth=oci_registry.auth)
    assert head.headers["docker-content-digest"] == digest


def test_modelcar_is_an_image_with_models_in_one_tar_gz(oci_registry: OciRegistry, tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "car"\n')
    (model / "1" / "model.onnx").write_bytes(os.urandom(10_000))
    digest = oci_registry.push_modelcar("models/car", "v1", model)
    r = manifest(oci_registry, "models/car", "v1")
    assert r.headers["docker-content-digest"] == digest
    body = r.json()
    assert body["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    (layer,) = body["layers"]
    assert layer["mediaType"] == OCI_LAYER_TAR_GZIP
    data = blob(oci_registry, "models/car", layer["digest"]).content
    assert (sha256(data), len(data)) == (layer["digest"], layer["size"])
    tar_bytes = gzip.decompress(data)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        names = tar.getnames()
        assert names == ["models", "models/1", "models/1/model.onnx", "models/config.pbtxt"]
        member = tar.extractfile("models/1/model.onnx")
        assert member is not None and member.read() == (model / "1" / "model.onnx").read_bytes()
    config = blob(oci_registry, "models/car", body["config"]["digest"]).json()
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["rootfs"] == {"type": "layers", "diff_ids": [sha256(tar_bytes)]}


def test_corrupted_blob_is_served_as_it_is_on_disk(oci_registry: OciRegistry, tmp_path: Path) -> None:
    """The registry checks a blob's digest when it is uploaded, not when it serves it: the rewritten bytes go out
    with the original digest in ``Docker-Content-Digest`` and the original length. Clients must check."""
    files = two_files(tmp_path)
    oci_registry.push_artifact("models/corrupt", "v1", files)
    layer = manifest(oci_registry, "models/corrupt", "v1").json()["layers"][1]
    path = oci_registry.corrupt_blob(layer["digest"])
    assert path.read_bytes() != files["1/model.onnx"].read_bytes()
    got = blob(oci_registry, "models/corrupt", layer["digest"])
    assert got.headers["docker-content-digest"] == layer["digest"]
    assert len(got.content) == layer["size"] == int(got.headers["content-length"])
    assert sha256(got.content) != layer["digest"]


def test_stop_and_start_keep_the_content(tmp_path: Path) -> None:
    with OciRegistry(tmp_path / "registry") as registry:
        digest = registry.push_artifact("models/kept", "v1", {"config.pbtxt": two_files(tmp_path)["config.pbtxt"]})
        url, auth = registry.url, registry.auth
        registry.stop()
        assert not registry.running()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/v2/", timeout=2)
        registry.start()
        assert (registry.url, registry.auth) == (url, auth)
        assert manifest(registry, "models/kept", "v1").headers["docker-content-digest"] == digest
    assert not registry.running()


def test_anonymous_read(tmp_path: Path) -> None:
    with OciRegistry(tmp_path / "registry", anonymous_read=True) as registry:
        assert registry.auth is None
        assert httpx.get(f"{registry.url}/v2/").status_code == 200
        registry.push_artifact("models/public", "v1", two_files(tmp_path))
        r = httpx.get(f"{registry.url}/v2/models/public/manifests/v1", headers=ACCEPT)
        assert r.status_code == 200
        assert [layer["annotations"][TITLE] for layer in r.json()["layers"]] == ["config.pbtxt", "1/model.onnx"]
