"""``hf://`` sources through the operator's writer, against a local Hugging Face Hub.

No open Hugging Face Hub server exists, so ``tests.support.hub_server`` implements the Hub's documented endpoints
that the official client calls (model info and its revision, the repository tree, resolve with its LFS
redirect to a CDN on another origin), and the code under test drives it with huggingface_hub's own client code
(``HfApi.model_info``, ``HfApi.list_repo_tree``, ``hf_hub_url``): nothing of either client is mocked. Every
request, huggingface_hub's included, goes out through the guarded StoreClient (the servers see kubeinfer's
User-Agent on each); a revision resolves to a commit the status records; LFS files are checked against their
sha256; a gated model's token goes to the Hub only, never to the CDN, and never into a message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy
from kubeinfer.server.sources.errors import REFUSED, SourceError
from kubeinfer.server.sources.hf import HfSource
from kubeinfer.server.sources.uris import parse_hf

from tests.support.hub_server import HubServer
from tests.support.sources import NS, make_writer, model_spec, names_in, relu_onnx, secret_lookup, volume_root

RIGHT_TOKEN = "hf_right_token_for_the_gated_model"
WRONG_TOKEN = "hf_wrong_token_nobody_knows"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The Hub and its CDN over TLS (a test CA the operator is given), tree listings paged two entries a page."""
    with HubServer(tmp_path_factory.mktemp("hub"), tls=True, tree_page=2) as server:
        yield server


@pytest.fixture(scope="module")
def onnx_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return relu_onnx(tmp_path_factory.mktemp("model") / "relu.onnx").read_bytes()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return volume_root(tmp_path)


def test_a_file_of_a_repository_becomes_the_model_file_pinned_by_the_commit(
    root: Path, hub: HubServer, onnx_bytes: bytes
) -> None:
    sha = hub.add_commit(
        "org/model", {"model.onnx": onnx_bytes, "README.md": b"# relu\n", "config.json": b"{}"}, lfs={"model.onnx"}
    )
    writer = make_writer(root, ca_file=hub.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch()
    seen_before = len(hub.hub_seen.requests)
    source = {"uri": "hf://org/model@main/model.onnx", "endpoint": hub.url}
    result = writer.sync_model(server_dir, render_model("m", model_spec(source)), fetch=fetch)
    assert result.added_versions == [1]
    assert (server_dir / "m/1/model.onnx").read_bytes() == onnx_bytes
    assert names_in(server_dir / "m/1") == [SOURCE_MARKER, "model.onnx"]
    assert fetch.served == {1: f"hf-commit {sha}"}
    assert read_model(server_dir, "m").error == ""
    # huggingface_hub resolved the revision and listed the tree; every request (its own too) went out through
    # the guarded client, and the LFS file came from the CDN the Hub redirected to
    asked = hub.hub_seen.requests[seen_before:]
    paths = [r.path.split("?")[0] for r in asked]
    assert "/api/models/org/model/revision/main" in paths
    assert f"/api/models/org/model/tree/{sha}" in paths
    assert f"/org/model/resolve/{sha}/model.onnx" in paths
    assert {r.user_agent for r in asked} == {"kubeinfer"}
    assert any(r.path.startswith(f"/lfs/{hashlib.sha256(onnx_bytes).hexdigest()}") for r in hub.cdn_seen.requests)
    assert writer.stores.client.backend.connected


def test_a_folder_of_a_repository_keeps_its_paths(root: Path, hub: HubServer) -> None:
    variables = bytes(range(256)) * 400
    sha = hub.add_commit(
        "org/saved",
        {
            "README.md": b"not fetched: outside the folder",
            "savedmodel/saved_model.pb": b"graph",
            "savedmodel/fingerprint.pb": b"fp",
            "savedmodel/variables/variables.index": b"index",
            "savedmodel/variables/variables.data-00000-of-00001": variables,
        },
        lfs={"savedmodel/variables/variables.data-00000-of-00001"},
        ref="v1",
    )
    writer = make_writer(root, ca_file=hub.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch()
    source = {"uri": "hf://org/saved@v1/savedmodel/", "endpoint": hub.url}
    writer.sync_model(server_dir, render_model("tf", model_spec(source, "tensorflow_savedmodel")), fetch=fetch)
    assert names_in(server_dir / "tf/1") == [
        SOURCE_MARKER,
        "model.savedmodel/fingerprint.pb",
        "model.savedmodel/saved_model.pb",
        "model.savedmodel/variables/variables.data-00000-of-00001",
        "model.savedmodel/variables/variables.index",
    ]
    assert (server_dir / "tf/1/model.savedmodel/variables/variables.data-00000-of-00001").read_bytes() == variables
    assert fetch.served == {1: f"hf-commit {sha}"}
    # the listing came in pages (two entries each): huggingface_hub followed the Link headers, through the guard
    pages = [r for r in hub.hub_seen.requests if r.path.startswith(f"/api/models/org/saved/tree/{sha}/savedmodel")]
    assert len(pages) == 3 and all(r.user_agent == "kubeinfer" for r in pages)


def test_the_whole_repository_at_a_pinned_commit(root: Path, hub: HubServer, onnx_bytes: bytes) -> None:
    sha = hub.add_commit("org/whole", {"model.onnx": onnx_bytes, "labels.txt": b"a\nb\n"}, lfs={"model.onnx"})
    hub.add_commit("org/whole", {"model.onnx": b"a later commit on main"}, lfs={"model.onnx"})
    writer = make_writer(root, ca_file=hub.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch()
    source = {"uri": f"hf://org/whole@{sha}", "endpoint": hub.url}
    writer.sync_model(server_dir, render_model("w", model_spec(source)), fetch=fetch)
    assert names_in(server_dir / "w/1") == [SOURCE_MARKER, "labels.txt", "model.onnx"]
    assert (server_dir / "w/1/model.onnx").read_bytes() == onnx_bytes
    assert fetch.served == {1: f"hf-commit {sha}"}


def test_a_revision_or_file_that_does_not_exist_is_not_found(root: Path, hub: HubServer, onnx_bytes: bytes) -> None:
    hub.add_commit("org/present", {"model.onnx": onnx_bytes}, lfs={"model.onnx"})
    writer = make_writer(root, ca_file=hub.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    for name, uri in (
        ("r", "hf://org/present@no-such-branch/model.onnx"),
        ("f", "hf://org/present@main/other.onnx"),
        ("d", "hf://org/present@main/missing/"),
    ):
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(
                server_dir, render_model(name, model_spec({"uri": uri, "endpoint": hub.url})), fetch=Fetch()
            )
        assert info.value.reason == "SourceNotFound", (uri, info.value.message)
        assert not (server_dir / name).exists()


def test_a_gated_model_needs_the_right_token_which_goes_to_the_hub_only(
    root: Path, hub: HubServer, onnx_bytes: bytes
) -> None:
    hub.add_commit("org/gated", {"model.onnx": onnx_bytes}, lfs={"model.onnx"}, gated_for={RIGHT_TOKEN})
    writer = make_writer(root, ca_file=hub.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = model_spec({"uri": "hf://org/gated@main/model.onnx", "endpoint": hub.url})
    # no Secret: the Hub refuses the gated file
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("a", spec), fetch=Fetch())
    assert info.value.reason == "SourceUnauthorized" and "gated" in info.value.message
    assert not (server_dir / "a").exists()
    with_secret = model_spec({"uri": "hf://org/gated@main/model.onnx", "endpoint": hub.url, "credentialsSecret": "hf"})
    # a token the Hub does not know: refused, and it appears in no message
    wrong = Fetch(secret_lookup({"token": WRONG_TOKEN}, "127.0.0.1"))
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("b", with_secret), fetch=wrong)
    assert info.value.reason == "SourceUnauthorized" and WRONG_TOKEN not in info.value.message
    # the right one: the file; the token went to the Hub's origin, never to the CDN it redirected to
    cdn_before = len(hub.cdn_seen.requests)
    right = Fetch(secret_lookup({"token": RIGHT_TOKEN}, "127.0.0.1"))
    writer.sync_model(server_dir, render_model("c", with_secret), fetch=right)
    assert (server_dir / "c/1/model.onnx").read_bytes() == onnx_bytes
    resolved = [r for r in hub.hub_seen.requests if r.path.startswith("/org/gated/resolve/")]
    assert resolved and resolved[-1].authorization == f"Bearer {RIGHT_TOKEN}"
    assert len(hub.cdn_seen.requests) > cdn_before
    assert all(r.authorization is None for r in hub.cdn_seen.requests)
    # a Secret without the key, and a token over plain http: refused before any request
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("d", with_secret), fetch=Fetch(secret_lookup({}, "127.0.0.1")))
    assert info.value.reason == "SourceUnauthorized" and "token" in info.value.message
    plain = model_spec(
        {"uri": "hf://org/gated@main/model.onnx", "endpoint": "http://127.0.0.1:9", "credentialsSecret": "hf"}
    )
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("e", plain), fetch=right)
    assert info.value.reason == "SourceRefused" and RIGHT_TOKEN not in info.value.message


def test_an_lfs_file_that_does_not_match_its_sha256_writes_nothing(root: Path, hub: HubServer) -> None:
    payload = b"unique bytes for the corrupt test " * 4096
    hub.add_commit("org/corrupt", {"model.onnx": payload}, lfs={"model.onnx"})
    hub.cdn_override[hashlib.sha256(payload).hexdigest()] = b"X" * len(payload)  # same size, other bytes
    writer = make_writer(root, ca_file=hub.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": "hf://org/corrupt@main/model.onnx", "endpoint": hub.url}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("c", model_spec(source)), fetch=Fetch())
    assert info.value.reason == "ChecksumMismatch" and "hf-lfs" in info.value.message
    assert not (server_dir / "c").exists()
    assert not [p for p in server_dir.parent.rglob("*") if "model.onnx" in p.name]


def test_a_hub_at_a_refused_address_is_never_contacted(root: Path, hub: HubServer) -> None:
    writer = make_writer(root, policy=AddressPolicy())  # public addresses only
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": "hf://org/model@main/model.onnx", "endpoint": hub.url}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", model_spec(source)), fetch=Fetch())
    assert info.value.reason == "SourceRefused" and "loopback" in info.value.message
    assert writer.stores.client.backend.connected == []


def test_huggingface_hubs_own_requests_meet_the_guard(hub: HubServer, onnx_bytes: bytes) -> None:
    """Past the operator's precheck: huggingface_hub's API call itself is refused by the guard, and once its
    client is ours, a call from outside an hf:// source is not sent at all."""
    hub.add_commit("org/direct", {"model.onnx": onnx_bytes}, lfs={"model.onnx"})
    refused = StoreClient(AddressPolicy())
    source = HfSource(refused, parse_hf("hf://org/direct/model.onnx"), NS, endpoint=hub.url)
    with pytest.raises(SourceError) as info:
        source.files(10, 1 << 30)
    assert info.value.reason == REFUSED and "loopback" in info.value.message
    assert refused.backend.connected == []
    seen = len(hub.hub_seen.requests)
    with pytest.raises(SourceError) as info:
        HfApi(endpoint=hub.url, token=False).model_info("org/direct")
    assert info.value.reason == REFUSED
    assert len(hub.hub_seen.requests) == seen
