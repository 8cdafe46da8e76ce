"""RepositoryWriter on a real folder: atomic layout, all-or-nothing fetches, cleanup of leftovers."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetcher
from kubeinfer.operator.volume import repository_writer
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER, RepositoryWriter
from kubeinfer.server.config import ConfigError, load_config_file
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
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


NS = "ns"


def make_writer(root: Path, **kw) -> RepositoryWriter:
    """The writer with downloads allowed to reach this machine's test file server (127.0.0.1)."""
    allowed = AddressPolicy(allowed=parse_networks(["127.0.0.0/8"]))
    kw.setdefault("fetcher", Fetcher(allowed, timeout=kw.get("timeout", 60.0)))
    return RepositoryWriter(root, **kw)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The volume root; this namespace's uploads are in ``<root>/ns/uploads``."""
    (tmp_path / NS / "uploads").mkdir(parents=True)
    for name, op in (("relu.onnx", "Relu"), ("neg.onnx", "Neg")):
        onnx.save(unary(name, op, TensorProto.FLOAT, ["batch", 4]), tmp_path / NS / "uploads" / name)
    return tmp_path


@pytest.fixture
def http_files(root: Path) -> Iterator[str]:
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root / NS / "uploads"))  # noqa: E731
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
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = _spec(
        [
            {"version": 1, "source": {"path": "uploads/relu.onnx"}},
            {"version": 2, "source": {"uri": f"{http_files}/neg.onnx", "sha256": sha(root / NS / "uploads/neg.onnx")}},
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
    assert (server_dir / "m/2/model.onnx").read_bytes() == (root / NS / "uploads/neg.onnx").read_bytes()
    source = read_model(server_dir, "m")  # what the server itself sees
    assert source.error == "" and sorted(source.versions) == [1, 2]
    assert load_config_file(server_dir / "m/config.pbtxt").max_batch_size == 8
    again = writer.sync_model(server_dir, render_model("m", spec))
    assert not again.changed


def test_a_source_record_a_crash_left_torn_makes_the_version_written_again(root, monkeypatch):
    """The version's source record is the one file written without an fsync (the server never reads it): one
    left empty or torn by a crash reads as stale, so the next sync writes the version again; the model file
    and the config are fsynced, as is every folder."""
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    writer.sync_model(server_dir, render_model("m", spec))
    names = [Path(p).name for p in synced]
    assert "model.onnx" in names and "config.pbtxt" in names and SOURCE_MARKER not in names
    for torn in (b"", b'{"path": "uploads/rel'):
        (server_dir / "m" / "1" / SOURCE_MARKER).write_bytes(torn)
        again = writer.sync_model(server_dir, render_model("m", spec))
        assert again.replaced_versions == [1]
        assert not writer.sync_model(server_dir, render_model("m", spec)).changed


def test_checksum_mismatch_changes_nothing(root, http_files):
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
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
    writer = make_writer(root, timeout=2)
    server_dir = writer.server_dir(NS, "ns/pool")
    for uri, reason in ((f"{http_files}/nope.onnx", "FetchFailed"), ("http://127.0.0.1:1/x.onnx", "FetchFailed")):
        spec = _spec([{"version": 1, "source": {"uri": uri, "sha256": "0" * 64}}])
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model("m", spec))
        assert info.value.reason == reason
        assert listing(server_dir) == []


def test_size_limit(root):
    writer = make_writer(root, max_bytes=10)
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            writer.server_dir(NS, "ns/pool"),
            render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])),
        )
    assert info.value.reason == "TooLarge"


@pytest.mark.parametrize(
    "path",
    [
        "../outside.onnx",
        "../../outside.onnx",
        "../other/uploads/theirs.onnx",
        "/etc/passwd",
        "link/relu.onnx",
        "uploads/linked.onnx",
        "uploads/theirs.onnx",
        "uploads/\0x",
        "x" * 5000,
    ],
)
def test_paths_outside_the_namespace_folder_or_through_symlinks_are_refused(root, path):
    (root.parent / "outside.onnx").write_bytes(b"x")
    (root / "outside.onnx").write_bytes(b"x")
    (root / "other" / "uploads").mkdir(parents=True)
    (root / "other" / "uploads" / "theirs.onnx").write_bytes(b"x")
    os.symlink(root / "other" / "uploads" / "theirs.onnx", root / NS / "uploads" / "theirs.onnx")
    os.symlink(root / NS / "uploads", root / NS / "link")
    os.symlink(root / NS / "uploads/relu.onnx", root / NS / "uploads/linked.onnx")
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": path}}])))
    assert info.value.reason == "PathRejected"
    assert listing(server_dir) == []


def test_dims_that_contradict_the_onnx_file(root):
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}], dims=[1, 4])  # batch dim included
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", spec))
    assert info.value.reason == "ConfigMismatch"
    assert "dims must not include the batch dimension" in info.value.message
    assert listing(server_dir) == []


def test_add_replace_and_remove_versions_config_last(root):
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
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
    assert (server_dir / "m/1/model.onnx").read_bytes() == (root / NS / "uploads/neg.onnx").read_bytes()
    assert "max_batch_size: 4" in (server_dir / "m/config.pbtxt").read_text()
    result = writer.sync_model(
        server_dir, render_model("m", _spec([{"version": 2, "source": {"path": "uploads/relu.onnx"}}]))
    )
    assert result.removed_versions == [1]
    assert [p for p in listing(server_dir) if p.count("/") == 1] == ["m/2", "m/config.pbtxt"]


def test_stale_leftovers_are_cleaned_but_not_other_models(root):
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
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
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    writer.sync_model(server_dir, render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])))
    assert writer.remove_model(server_dir, "m")
    assert listing(server_dir) == []
    assert not writer.remove_model(server_dir, "m")


@pytest.mark.parametrize(
    ("subpath", "problem"),
    [
        ("../x", "without '.', '..' or hidden parts"),
        ("ns/../other/pool", "without '.', '..' or hidden parts"),
        ("ns/.hidden", "without '.', '..' or hidden parts"),
        ("/abs/pool", "without '.', '..' or hidden parts"),
        ("other/pool", "outside the folder of namespace 'ns'"),
        ("ns", "outside the folder of namespace 'ns'"),
        ("ns/escape/pool", "passes through a symlink"),
    ],
)
def test_server_folder_must_stay_inside_the_namespace_folder(root, subpath, problem):
    writer = make_writer(root)
    os.symlink(root.parent, root / NS / "escape")
    with pytest.raises(ArtifactError) as info:
        writer.server_dir(NS, subpath)
    assert info.value.reason == "PathRejected" and problem in info.value.message


def test_a_symlinked_namespace_folder_is_refused(root):
    (root / "victim" / "uploads").mkdir(parents=True)
    os.symlink(root / "victim", root / "evil")
    writer = make_writer(root)
    with pytest.raises(ArtifactError, match="passes through a symlink"):
        writer.server_dir("evil", "evil/pool")


def _victim(root: Path) -> Path:
    """Another namespace's live model on the same volume."""
    victim = root / "other" / "pool" / "m"
    (victim / "1").mkdir(parents=True)
    (victim / "config.pbtxt").write_text("theirs")
    (victim / "1" / "model.onnx").write_bytes(b"theirs")
    (victim / ".1.staging-0123abcd").mkdir()  # their writer's work in progress
    return victim


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in folder.rglob("*")}


@pytest.mark.parametrize("planted", ["model", "version", "config"])
def test_symlinks_planted_in_a_server_folder_never_redirect_writes(root, planted):
    victim = _victim(root)
    before = _snapshot(victim)
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    if planted == "model":
        os.symlink(victim, server_dir / "m")
    else:
        (server_dir / "m").mkdir()
        target, link = (victim / "1", "1") if planted == "version" else (victim / "config.pbtxt", "config.pbtxt")
        os.symlink(target, server_dir / "m" / link)
    spec = _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", spec))
    assert info.value.reason == "PathRejected" and "is a symlink" in info.value.message
    assert _snapshot(victim) == before
    writer.remove_model(server_dir, "m")  # removes the link (or the folder holding it), never what it points to
    assert _snapshot(victim) == before
    assert not (server_dir / "m").exists() and not (server_dir / "m").is_symlink()


def test_a_file_name_that_escapes_is_refused_even_past_the_renderer(root):
    """The writer checks the rule again where it joins the name, whatever built the RenderedModel."""
    victim = _victim(root)
    before = _snapshot(victim)
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    rendered = render_model("m", _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    forged = dataclasses.replace(rendered, filename="../../../other/pool/m/1/model.onnx")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, forged)
    assert info.value.reason == "PathRejected" and "default_model_filename" in info.value.message
    assert _snapshot(victim) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("defaultModelFilename", "../../../other/pool/m/1/model.py"),
        ("defaultModelFilename", "/models/other/model.py"),
        ("defaultModelFilename", ".model.py"),
    ],
)
def test_render_refuses_file_names_that_are_paths(field, value):
    spec = {k: v for k, v in _spec([{"version": 1, "source": {"path": "uploads/m.py"}}]).items() if k != "platform"}
    spec.update({"backend": "python", field: value})
    with pytest.raises(ConfigError, match="default_model_filename"):
        render_model("m", spec)


def test_render_refuses_label_file_names_that_are_paths():
    spec = _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
    spec["outputs"][0]["labelFilename"] = "../../../other/secrets.txt"
    with pytest.raises(ConfigError, match="output 'OUT' label_filename"):
        render_model("m", spec)


@pytest.mark.parametrize(
    "forged",
    ["other/pool/m", "ns/pool/../../other/pool/m", "../other/pool/m", "/other/pool/m", "ns/other-pool/other-model"],
)
def test_a_forged_status_repository_path_never_removes_another_tenants_model(root, forged):
    """status.repositoryPath is writable by whoever may patch the status: it is only trusted inside the namespace."""
    from kubeinfer.operator.controllers.reconciler import Reconciler
    from kubeinfer.operator.controllers.settings import OperatorConfig

    victim = _victim(root)
    (root / NS / "other-pool" / "other-model" / "1").mkdir(parents=True)
    before = _snapshot(victim)
    reconciler = Reconciler(OperatorConfig(repository_root=root), kube=None)  # type: ignore[arg-type]
    reconciler.model_controller._forget_old_location(NS, "m", forged, "ns/pool/m")
    assert _snapshot(victim) == before
    assert (root / NS / "other-pool" / "other-model" / "1").is_dir()


def test_staging_happens_outside_the_namespace_folder_and_its_debris_is_cleaned(root, monkeypatch):
    """Staged folders live in ``<root>/.kubeinfer-staging/<server folder>/`` (0700), never in the tenant's folder;
    leftovers of an interrupted write there are found by the next sync of that model, and only that model's."""
    monkeypatch.setattr(repository_writer, "LISTING_TTL", 0.0)  # no shared listing between the two syncs
    writer = RepositoryWriter(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    seen_in_tenant_folder: list[list[str]] = []
    spec = _spec([{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
    writer.sync_model(
        server_dir,
        render_model("m", spec),
        on_stage=lambda v: seen_in_tenant_folder.append([str(p.relative_to(root)) for p in (root / NS).rglob(".*")]),
    )
    assert seen_in_tenant_folder == [[]]  # while staging, nothing of it shows in the namespace folder
    staging = root / ".kubeinfer-staging"
    assert staging.is_dir() and (staging.stat().st_mode & 0o777) == 0o700
    mirror = staging / "ns" / "pool"
    (mirror / ".m.staging-deadbeef" / "1").mkdir(parents=True)  # a crashed writer's work
    (mirror / ".m.deleting-0badc0de").mkdir()
    (mirror / ".m.b.staging-deadbeef").mkdir()  # model "m.b": not ours to clean
    (mirror / "m").mkdir(exist_ok=True)
    (mirror / "m" / ".2.staging-0123abcd").mkdir()
    (mirror / "m" / ".config.pbtxt.tmp-0123abcd").write_text("half")
    result = writer.sync_model(server_dir, render_model("m", spec))
    assert sorted(result.cleaned) == [
        ".kubeinfer-staging/ns/pool/.m.deleting-0badc0de",
        ".kubeinfer-staging/ns/pool/.m.staging-deadbeef",
        ".kubeinfer-staging/ns/pool/m/.2.staging-0123abcd",
        ".kubeinfer-staging/ns/pool/m/.config.pbtxt.tmp-0123abcd",
    ]
    assert sorted(p.name for p in mirror.iterdir()) == [".m.b.staging-deadbeef", "m"]
    assert writer.remove_model(server_dir, "m")
    assert sorted(p.name for p in mirror.iterdir()) == [".m.b.staging-deadbeef"]  # the model's mirror went too
    assert listing(server_dir) == []
