"""The atomic-publish helper every repository writer uses (operator and ``kubeinfer convert``), on folder descriptors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.server.repository import confined, publish
from kubeinfer.server.repository.scan import read_model


@pytest.fixture
def fd_of() -> Iterator:
    opened: list[int] = []

    def open_folder(path: Path) -> int:
        opened.append(confined.open_root(path))
        return opened[-1]

    yield open_folder
    for fd in opened:
        os.close(fd)


def test_staged_folder_is_invisible_until_published_and_replaces_the_old_one(tmp_path: Path, fd_of) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    (model / "1").mkdir()
    (model / "1" / "model.onnx").write_bytes(b"old")
    model_fd = fd_of(model)
    staged, staged_fd = publish.stage_dir(model_fd, "1")
    publish.write_file(staged_fd, "model.onnx", b"new")
    os.close(staged_fd)
    assert publish.leftover_of(staged) == "1"
    assert read_model(tmp_path, "m").versions == {1: model / "1"}  # the dot-name is not a version
    assert (model / "1" / "model.onnx").read_bytes() == b"old"

    assert publish.publish_dir(model_fd, staged, model_fd, "1") is True
    assert (model / "1" / "model.onnx").read_bytes() == b"new"
    assert sorted(p.name for p in model.iterdir()) == ["1", "config.pbtxt"]  # the old folder is gone


def test_staging_elsewhere_renames_across_folders_and_retires_there(tmp_path: Path, fd_of) -> None:
    """The operator stages (and deletes) in a folder of its own, then renames into the model's folder."""
    (tmp_path / "repo" / "m" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "m" / "1" / "model.onnx").write_bytes(b"old")
    (tmp_path / "staging").mkdir()
    model_fd, staging_fd = fd_of(tmp_path / "repo" / "m"), fd_of(tmp_path / "staging")
    staged, staged_fd = publish.stage_dir(staging_fd, "1")
    publish.write_file(staged_fd, "model.onnx", b"new")
    os.close(staged_fd)
    assert publish.publish_dir(staging_fd, staged, model_fd, "1", trash_fd=staging_fd)
    assert (tmp_path / "repo" / "m" / "1" / "model.onnx").read_bytes() == b"new"
    publish.replace_file(model_fd, "config.pbtxt", "c", tmp_fd=staging_fd)
    publish.retire(model_fd, "1", trash_fd=staging_fd)
    assert sorted(os.listdir(tmp_path / "repo" / "m")) == ["config.pbtxt"]
    assert os.listdir(tmp_path / "staging") == []


def test_replace_file_and_retire_leave_no_debris(tmp_path: Path, fd_of) -> None:
    (tmp_path / "config.pbtxt").write_text("a")
    folder = fd_of(tmp_path)
    publish.replace_file(folder, "config.pbtxt", "b")
    assert (tmp_path / "config.pbtxt").read_text() == "b"
    (tmp_path / "2").mkdir()
    publish.retire(folder, "2")
    assert [p.name for p in tmp_path.iterdir()] == ["config.pbtxt"]


def test_symlinks_in_the_way_are_replaced_or_removed_never_followed(tmp_path: Path, fd_of) -> None:
    """A symlink where a file, a folder or a retired folder goes: renamed over or unlinked, its target untouched."""
    victim = tmp_path / "victim"
    (victim / "1").mkdir(parents=True)
    (victim / "1" / "model.onnx").write_bytes(b"theirs")
    (victim / "config.pbtxt").write_text("theirs")
    model = tmp_path / "m"
    model.mkdir()
    os.symlink(victim / "config.pbtxt", model / "config.pbtxt")
    os.symlink(victim / "1", model / "1")
    os.symlink(victim, model / "2")
    model_fd = fd_of(model)
    publish.replace_file(model_fd, "config.pbtxt", "ours")
    staged, staged_fd = publish.stage_dir(model_fd, "1")
    publish.write_file(staged_fd, "model.onnx", b"ours")
    with pytest.raises(FileExistsError):  # a new file is never created through a symlink
        os.symlink(victim / "x", model / staged / "planted")
        publish.write_file(staged_fd, "planted", b"x")
    os.close(staged_fd)
    assert publish.publish_dir(model_fd, staged, model_fd, "1")
    publish.retire(model_fd, "2")
    assert not (model / "config.pbtxt").is_symlink() and (model / "config.pbtxt").read_text() == "ours"
    assert (model / "1" / "model.onnx").read_bytes() == b"ours"
    assert (victim / "1" / "model.onnx").read_bytes() == b"theirs" and (victim / "config.pbtxt").read_text() == "theirs"
    assert not (victim / "x").exists()


def test_leftover_names_follow_one_convention() -> None:
    assert publish.leftover_of(publish.hidden_name("config.pbtxt", publish.TMP)) == "config.pbtxt"
    assert publish.leftover_of(publish.hidden_name("my.model", publish.DELETING)) == "my.model"
    assert publish.leftover_of(".3.old-1234") is None  # not ours: cleanup leaves it alone
    assert publish.leftover_of("3") is None
