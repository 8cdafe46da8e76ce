"""``model_files.pinned_tree``: a folder model (a TensorFlow SavedModel) read through descriptors opened beneath
the repository, so a symlink swapped in after the load opened it cannot redirect what the library reads."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest
from kubeinfer.server.repository.layout import PathEscape
from kubeinfer.server.repository.model_files import ModelFolder, pinned_tree


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    saved = root / "m" / "1" / "model.savedmodel"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"graph")
    (saved / "variables" / "variables.index").write_bytes(b"index")
    (root / "shared").mkdir()
    (root / "shared" / "vocab.txt").write_bytes(b"a\nb\n")
    (saved / "assets").mkdir()
    # a link that stays inside the repository (another folder's file) is taken, as everywhere
    (saved / "assets" / "vocab.txt").symlink_to(root / "shared" / "vocab.txt")
    (tmp_path / "secret").write_bytes(b"outside")
    return root


def _tree(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if not p.is_dir()}


def test_the_mirror_reads_what_the_descriptors_hold_even_after_a_swap(repo: Path, tmp_path: Path) -> None:
    saved = repo / "m" / "1" / "model.savedmodel"
    folder = ModelFolder(repo, "m")
    with folder, folder.loading(repo / "m" / "1", 1):
        mirror = pinned_tree(saved)
        assert mirror != saved and pinned_tree(saved) == mirror  # made once per load
        assert stat.S_IMODE(os.stat(mirror).st_mode) == 0o700
        assert _tree(mirror) == {
            "assets/vocab.txt": b"a\nb\n",
            "saved_model.pb": b"graph",
            "variables/variables.index": b"index",
        }
        assert all(os.readlink(p).startswith("/proc/self/fd/") for p in mirror.rglob("*") if p.is_symlink())
        # a file swapped for a link out of the repository after the load opened it: the mirror still reads
        # the file that was opened
        index = saved / "variables" / "variables.index"
        index.unlink()
        index.symlink_to(tmp_path / "secret")
        assert (mirror / "variables" / "variables.index").read_bytes() == b"index"
    assert not mirror.exists()  # removed, and its descriptors closed, with the folder


def test_outside_a_load_the_path_comes_back_unchanged(repo: Path) -> None:
    saved = repo / "m" / "1" / "model.savedmodel"
    assert pinned_tree(saved) == saved


def test_a_link_leading_out_refuses_the_whole_folder(repo: Path, tmp_path: Path) -> None:
    saved = repo / "m" / "1" / "model.savedmodel"
    (saved / "variables" / "variables.data-00000-of-00001").symlink_to(tmp_path / "secret")
    before = set(Path(tempfile.gettempdir()).glob("kubeinfer-model-tree-*"))
    folder = ModelFolder(repo, "m")
    with folder, folder.loading(repo / "m" / "1", 1), pytest.raises(PathEscape) as info:
        pinned_tree(saved)
    shown = "m/1/model.savedmodel/variables/variables.data-00000-of-00001"
    assert f"version 1 model folder '{shown}' leads outside the model repository" in str(info.value)
    # the half-built mirror went with the refusal
    assert set(Path(tempfile.gettempdir()).glob("kubeinfer-model-tree-*")) == before


def test_a_folder_linked_into_itself_ends_with_an_error(repo: Path) -> None:
    saved = repo / "m" / "1" / "model.savedmodel"
    (saved / "variables" / "loop").symlink_to("..")
    folder = ModelFolder(repo, "m")
    with folder, folder.loading(repo / "m" / "1", 1), pytest.raises(OSError) as info:
        pinned_tree(saved)
    assert info.value.errno == errno.ELOOP and "folders deep" in str(info.value)


def test_a_file_where_the_folder_belongs_is_not_a_folder(repo: Path) -> None:
    (repo / "m" / "2").mkdir()
    (repo / "m" / "2" / "model.savedmodel").write_bytes(b"a file")
    folder = ModelFolder(repo, "m")
    with folder, folder.loading(repo / "m" / "2", 2), pytest.raises(NotADirectoryError):
        pinned_tree(repo / "m" / "2" / "model.savedmodel")
