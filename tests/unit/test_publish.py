"""The atomic-publish helper every repository writer uses (operator and ``kubeinfer convert``)."""

from __future__ import annotations

from pathlib import Path

from kubeinfer.server.repository import publish
from kubeinfer.server.repository.scan import read_model


def test_staged_folder_is_invisible_until_published_and_replaces_the_old_one(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    (model / "1").mkdir()
    (model / "1" / "model.onnx").write_bytes(b"old")
    staged = publish.stage_dir(model, "1")
    publish.write_file(staged / "model.onnx", b"new")
    assert publish.leftover_of(staged.name) == "1"
    assert read_model(tmp_path, "m").versions == {1: model / "1"}  # the dot-name is not a version
    assert (model / "1" / "model.onnx").read_bytes() == b"old"

    assert publish.publish_dir(staged, model / "1") is True
    assert (model / "1" / "model.onnx").read_bytes() == b"new"
    assert sorted(p.name for p in model.iterdir()) == ["1", "config.pbtxt"]  # the old folder is gone


def test_replace_file_and_retire_leave_no_debris(tmp_path: Path) -> None:
    target = tmp_path / "config.pbtxt"
    target.write_text("a")
    publish.replace_file(target, "b")
    assert target.read_text() == "b"
    (tmp_path / "2").mkdir()
    publish.retire(tmp_path / "2")
    assert [p.name for p in tmp_path.iterdir()] == ["config.pbtxt"]


def test_leftover_names_follow_one_convention() -> None:
    assert publish.leftover_of(publish.hidden_name("config.pbtxt", publish.TMP)) == "config.pbtxt"
    assert publish.leftover_of(publish.hidden_name("my.model", publish.DELETING)) == "my.model"
    assert publish.leftover_of(".3.old-1234") is None  # not ours: cleanup leaves it alone
    assert publish.leftover_of("3") is None
