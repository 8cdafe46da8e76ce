"""RepositoryWriter on a real folder: atomic layout, all-or-nothing fetches, cleanup of leftovers."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from kubeinfer.operator.artifacts import ArtifactError
from kubeinfer.operator.render import render_model
from kubeinfer.operator.repository_writer import SOURCE_MARKER, RepositoryWriter
from kubeinfer.server.config import load_config_file
from kubeinfer.server.repository.scan import read_model
from onnx import TensorProto

from tests.support.models import unary


def _spec(versions: list[dict], dims: list[int] | None = None) -> dict:
    return {
        "server": "s",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": dims or [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": dims or [4]}],
        "versionPolicy": {"all": {}},
        "versions": versions,
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "uploads").mkdir()
    for name, op in (("relu.onnx", "Relu"), ("neg.onnx", "Neg")):
        onnx.save(unary(name, op, TensorProto.FLOAT, ["batch", 4]), tmp_path / "uploads" / name)
    return tmp_path


@pytest.fixture
def http_files(root: Path) -> Iterator[str]:
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root / "uploads"))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_new_model_from_path_and_uri(root, http_files):
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("ns/pool")
    spec = _spec(
        [
            {"version": 1, "source": {"path": "uploads/relu.onnx"}},
            {"version": 2, "source": {"uri": f"{http_files}/neg.onnx", "sha256": sha(root / "uploads/neg.onnx")}},
        ]
    )
    result = writer.sync_model(server_dir, render_model("m", spec))
    assert result.created_model and result.added_versions == [1, 2]
    assert listing(server_dir) == [
        "m",
        "m/1",
        f"m/1/{SOURCE_MARKER}",
        "m/1/model.onnx",
        "m/2",
        f"m/2/{SOURCE_MARKER}",
        "m/2/model.onnx",
        "m/config.pbtxt",
    ]
    assert (server_dir / "m/2/model.onnx").read_bytes() == (root / "uploads/neg.onnx").read_bytes()
    source = read_model(server_dir, "m")  # what the server itself sees
    assert source.error == "" and sorted(source.versions) == [1, 2]
    assert load_config_file(server_dir / "m/config.pbtxt").max_batch_size == 8
    again = writer.sync_model(server_dir, render_model("m", spec))
    assert not again.changed


def test_checksum_mismatch_changes_nothing(root, http_files):
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("pool")
    v1 = {"version": 1, "source": {"path": "uploads/relu.onnx"}}
    writer.sync_model(server_dir, render_model("m", _spec([v1])))
    before = {p: p.stat().st_mtime_ns for p in server_dir.rglob("*") if p.is_file()}
    bad = {"version": 2, "source": {"uri": f"{http_files}/neg.onnx", "sha256": "0" * 64}}
    spec = _spec([bad])  # v1 dropped from the spec at the same time: must not be removed either
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", spec))
    assert info.value.reason == "ChecksumMismatch" and info.value.version == 2
    assert "fix source.sha256" in info.value.message
    assert {p: p.stat().st_mtime_ns for p in server_dir.rglob("*") if p.is_file()} == before


def test_unreachable_uri_and_missing_file(root, http_files):
    writer = RepositoryWriter(root, timeout=2)
    server_dir = writer.server_dir("pool")
    for uri, reason in ((f"{http_files}/nope.onnx", "FetchFailed"), ("http://127.0.0.1:1/x.onnx", "FetchFailed")):
        spec = _spec([{"version": 1, "source": {"uri": uri, "sha256": "0" * 64}}])
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model("m", spec))
        assert info.value.reason == reason
        assert listing(server_dir) == []


def test_size_limit(root):
    writer = RepositoryWriter(root, max_bytes=10)
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            writer.server_dir("pool"),
            render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])),
        )
    assert info.value.reason == "TooLarge"


@pytest.mark.parametrize("path", ["../outside.onnx", "/etc/passwd", "link/relu.onnx", "uploads/linked.onnx"])
def test_paths_outside_the_volume_or_through_symlinks_are_refused(root, path):
    (root.parent / "outside.onnx").write_bytes(b"x")
    os.symlink(root / "uploads", root / "link")
    os.symlink(root / "uploads/relu.onnx", root / "uploads/linked.onnx")
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("pool")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": path}}])))
    assert info.value.reason == "PathRejected"
    assert listing(server_dir) == []


def test_dims_that_contradict_the_onnx_file(root):
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("pool")
    spec = _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}], dims=[1, 4])  # batch dim included
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", spec))
    assert info.value.reason == "ConfigMismatch"
    assert "dims must not include the batch dimension" in info.value.message
    assert listing(server_dir) == []


def test_add_replace_and_remove_versions_config_last(root):
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("pool")
    writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])))
    config_before = (server_dir / "m/config.pbtxt").read_text()
    staged_while_config_old: list[str] = []
    spec = _spec(
        [
            {"version": 1, "source": {"path": "uploads/neg.onnx"}},
            {"version": 2, "source": {"path": "uploads/relu.onnx"}},
        ]
    )
    spec["maxBatchSize"] = 4
    result = writer.sync_model(
        server_dir,
        render_model("m", spec),
        on_stage=lambda v: staged_while_config_old.append((server_dir / "m/config.pbtxt").read_text()),
    )
    assert result.added_versions == [2] and result.replaced_versions == [1] and result.config_changed
    assert staged_while_config_old == [config_before, config_before]
    assert (server_dir / "m/1/model.onnx").read_bytes() == (root / "uploads/neg.onnx").read_bytes()
    assert "max_batch_size: 4" in (server_dir / "m/config.pbtxt").read_text()
    result = writer.sync_model(
        server_dir, render_model("m", _spec([{"version": 2, "source": {"path": "uploads/relu.onnx"}}]))
    )
    assert result.removed_versions == [1]
    assert [p for p in listing(server_dir) if p.count("/") == 1] == ["m/2", "m/config.pbtxt"]


def test_stale_leftovers_are_cleaned_but_not_other_models(root):
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("pool")
    (server_dir / ".m.staging-deadbeef").mkdir()
    (server_dir / ".m.b.staging-deadbeef").mkdir()  # belongs to model "m.b"
    writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])))
    (server_dir / "m/.3.staging-0123abcd").mkdir()
    (server_dir / "m/.config.pbtxt.tmp-0123abcd").write_text("half")
    (server_dir / "m/.1.deleting-0123abcd").mkdir()
    writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])))
    assert sorted(p.name for p in server_dir.iterdir()) == [".m.b.staging-deadbeef", "m"]
    assert sorted(p.name for p in (server_dir / "m").iterdir()) == ["1", "config.pbtxt"]


def test_remove_model(root):
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir("pool")
    writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])))
    assert writer.remove_model(server_dir, "m")
    assert listing(server_dir) == []
    assert not writer.remove_model(server_dir, "m")


def test_subpath_must_stay_inside(root):
    writer = RepositoryWriter(root)
    with pytest.raises(ArtifactError):
        writer.server_dir("../x")
    os.symlink(root.parent, root / "escape")
    with pytest.raises(ArtifactError):
        writer.server_dir("escape/pool")
