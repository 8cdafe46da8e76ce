"""A folder model (platform tensorflow_savedmodel) from a tar archive: the RepositoryWriter on a real folder
unpacks it into ``<version>/model.savedmodel/`` by the confined rules, and refuses hostile archives whole."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER
from kubeinfer.server.repository.scan import read_model

from tests.unit.operator.test_repository_writer import NS, http_files, listing, make_writer, sha  # noqa: F401

#: a SavedModel's layout (the bytes do not matter to the writer)
FILES = {
    "saved_model.pb": b"graph" * 100,
    "fingerprint.pb": b"fp",
    "variables/variables.index": b"index",
    "variables/variables.data-00000-of-00001": bytes(range(256)) * 40,
    "assets/vocab.txt": b"a\nb\n",
}


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _files(prefix: str = "") -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out: list[tuple[tarfile.TarInfo, bytes | None]] = []
    folders = sorted({str(Path(n).parent) for n in FILES if "/" in n})
    if prefix:
        out.append((tarfile.TarInfo(prefix.rstrip("/")), None))
        out[-1][0].type = tarfile.DIRTYPE
    for folder in folders:
        info = tarfile.TarInfo(prefix + folder)
        info.type = tarfile.DIRTYPE
        out.append((info, None))
    out += [(tarfile.TarInfo(prefix + name), data) for name, data in FILES.items()]
    return out


def _spec(source: dict) -> dict:
    return {"server": "s", "platform": "tensorflow_savedmodel", "versions": [{"version": 1, "source": source}]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / NS / "uploads").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(("prefix", "mode"), [("./", "w:gz"), ("model.savedmodel/", "w"), ("", "w:xz")])
def test_a_savedmodel_archive_is_unpacked_into_the_version_folder(root: Path, prefix: str, mode: str) -> None:
    _tar(root / NS / "uploads" / "sm.tar", _files(prefix), mode)
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    model = render_model("tfm", _spec({"path": "uploads/sm.tar"}))
    result = writer.sync_model(server_dir, model)
    assert result.created_model and result.added_versions == [1]
    saved = server_dir / "tfm" / "1" / "model.savedmodel"
    assert {str(p.relative_to(saved)): p.read_bytes() for p in saved.rglob("*") if p.is_file()} == FILES
    # the archive is gone; only the folder and the source marker are in the version folder
    assert sorted(p.name for p in (server_dir / "tfm" / "1").iterdir()) == [SOURCE_MARKER, "model.savedmodel"]
    source = read_model(server_dir, "tfm")  # what the server itself sees
    assert source.error == "" and list(source.versions) == [1]
    assert not writer.sync_model(server_dir, model).changed  # up to date: nothing fetched again


def test_a_savedmodel_archive_from_a_uri(root: Path, http_files: str) -> None:  # noqa: F811
    archive = _tar(root / NS / "uploads" / "sm.tgz", _files())
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    writer.sync_model(server_dir, render_model("tfm", _spec({"uri": f"{http_files}/sm.tgz", "sha256": sha(archive)})))
    assert (server_dir / "tfm" / "1" / "model.savedmodel" / "saved_model.pb").read_bytes() == FILES["saved_model.pb"]


def _hostile(kind: str) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    members = _files()
    info = tarfile.TarInfo({"dotdot": "../escape", "absolute": "/tmp/escape"}.get(kind, "variables/bad"))
    data: bytes | None = b"x"
    if kind == "symlink":
        info.type, info.linkname, data = tarfile.SYMTYPE, "/etc/passwd", None
    elif kind == "hardlink":
        info.type, info.linkname, data = tarfile.LNKTYPE, "saved_model.pb", None
    elif kind == "device":
        info.type, info.devmajor, info.devminor, data = tarfile.CHRTYPE, 1, 3, None
    elif kind == "fifo":
        info.type, data = tarfile.FIFOTYPE, None
    return [*members, (info, data)]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("dotdot", "entry '../escape' leads outside the model folder"),
        ("absolute", "entry '/tmp/escape' leads outside the model folder"),
        ("symlink", "entry 'variables/bad' is a symbolic link"),
        ("hardlink", "entry 'variables/bad' is a hard link"),
        ("device", "entry 'variables/bad' is a device"),
        ("fifo", "entry 'variables/bad' is a FIFO"),
    ],
)
def test_a_hostile_archive_is_refused_whole_and_nothing_is_published(root: Path, kind: str, message: str) -> None:
    _tar(root / NS / "uploads" / "sm.tgz", _hostile(kind))
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("tfm", _spec({"path": "uploads/sm.tgz"})))
    assert info.value.reason == "ArchiveRejected" and info.value.version == 1
    assert message in info.value.message and "source.path 'uploads/sm.tgz'" in info.value.message
    assert listing(server_dir) == []
    assert not (root / "escape").exists() and not Path("/tmp/escape").exists()
    assert not list((root / ".kubeinfer-staging").rglob("*savedmodel*"))  # staging cleaned up


def test_unpacked_size_limit_and_a_file_that_is_no_tar(root: Path) -> None:
    _tar(root / NS / "uploads" / "sm.tgz", _files())
    (root / NS / "uploads" / "plain.pb").write_bytes(b"not an archive at all")
    writer = make_writer(root, max_bytes=5000)  # the archive fits; what it unpacks to does not
    server_dir = writer.server_dir(NS, "ns/pool")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("tfm", _spec({"path": "uploads/sm.tgz"})))
    assert info.value.reason == "TooLarge" and "unpacks to more than the limit of 5000 bytes" in info.value.message
    with pytest.raises(ArtifactError) as info:
        make_writer(root).sync_model(server_dir, render_model("tfm", _spec({"path": "uploads/plain.pb"})))
    assert info.value.reason == "ArchiveRejected" and "is not a readable tar archive" in info.value.message
    assert listing(server_dir) == []


def test_render_takes_the_platform_and_names_the_folder() -> None:
    from kubeinfer.server.config import ConfigError

    model = render_model("tfm", _spec({"path": "uploads/sm.tgz"}))
    assert model.filename == "model.savedmodel" and 'platform: "tensorflow_savedmodel"' in model.config_text
    with pytest.raises(ConfigError) as info:
        render_model("tfm", _spec({"path": "uploads/sm.tgz"}), server_backends=["onnxruntime", "python"], server="pool")
    assert "InferenceServer 'pool' does not provide backend 'tensorflow'" in str(info.value)


def test_a_new_version_of_an_existing_savedmodel_model(root: Path) -> None:
    _tar(root / NS / "uploads" / "v1.tgz", _files())
    _tar(root / NS / "uploads" / "v2.tgz", _files("model.savedmodel/"))
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    writer.sync_model(server_dir, render_model("tfm", _spec({"path": "uploads/v1.tgz"})))
    spec = _spec({"path": "uploads/v1.tgz"})
    spec["versions"].append({"version": 2, "source": {"path": "uploads/v2.tgz"}})
    spec["versionPolicy"] = {"all": {}}
    result = writer.sync_model(server_dir, render_model("tfm", spec))
    assert result.added_versions == [2]
    assert sorted(read_model(server_dir, "tfm").versions) == [1, 2]
    assert (server_dir / "tfm/2/model.savedmodel/variables/variables.index").read_bytes() == FILES[
        "variables/variables.index"
    ]
