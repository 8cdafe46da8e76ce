"""The file-name rule (``config.check_file_name``) and the symlink confinement (``repository.resolve_inside``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubeinfer.server.config import (
    ConfigError,
    check_file_name,
    check_op_library_filename,
    parse_config_text,
    validate_config,
)
from kubeinfer.server.repository.layout import PathEscape, check_model_name, op_library_path, resolve_inside
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.vocabulary.errors import InvalidArgument


@pytest.mark.parametrize("name", ["model.onnx", "model.plan", "labels.txt", "a-b_c.d", "ünïcode.py", "x" * 255])
def test_plain_file_names_pass(name: str) -> None:
    check_file_name(name, "default_model_filename")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "is empty"),
        ("..", "starts with '.'"),
        (".", "starts with '.'"),
        (".hidden", "starts with '.'"),
        ("../x", "path separator"),
        ("a/b", "path separator"),
        ("/etc/passwd", "path separator"),
        ("a\\b", "path separator"),
        ("a\x00b", "control character"),
        ("a\nb", "control character"),
        ("a\x7fb", "control character"),
        ("x" * 256, "256 bytes long"),
        ("é" * 128, "256 bytes long"),  # 128 characters, 256 bytes
    ],
)
def test_names_that_are_not_one_plain_component_fail(name: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="default_model_filename") as info:
        check_file_name(name, "default_model_filename")
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('default_model_filename: "../m.onnx"', "default_model_filename"),
        ('cc_model_filenames { key: "8.0" value: "/abs.plan" }', "cc_model_filenames['8.0']"),
        (
            'output [ { name: "o" data_type: TYPE_FP32 dims: [1] label_filename: "../l.txt" } ]',
            "output 'o' label_filename",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "i" value: { data_type: TYPE_FP32 dims: [1] '
            'input_data_file: "../../x" } } } ]',
            "model_warmup 'w' input 'i' input_data_file",
        ),
        (
            'sequence_batching { state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 dims: [1] '
            'initial_state [ { data_type: TYPE_FP32 dims: [1] data_file: "/etc/shadow" name: "i" } ] } ] }',
            "sequence_batching state 's' data_file",
        ),
        ('model_operations { op_library_filename: "../lib.so" }', "model_operations op_library_filename"),
    ],
)
def test_validate_config_checks_every_file_name_field(text: str, field: str) -> None:
    config = parse_config_text('platform: "onnxruntime_onnx"\n' + text)
    with pytest.raises(ConfigError) as info:
        validate_config(config, None)
    assert str(info.value).startswith(field), str(info.value)


def test_model_names_longer_than_a_folder_name_are_invalid_arguments() -> None:
    check_model_name("m" * 255)
    with pytest.raises(InvalidArgument, match="at most 255 bytes"):
        check_model_name("m" * 256)


def test_resolve_inside(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "m").mkdir(parents=True)
    (tmp_path / "secret").write_text("x")
    (root / "m" / "f").write_text("y")
    os.symlink(root / "m" / "f", root / "m" / "inside")
    os.symlink(tmp_path / "secret", root / "m" / "abs-out")
    os.symlink("../../secret", root / "m" / "rel-out")
    os.symlink("loop", root / "m" / "loop")
    assert resolve_inside(root, root / "m" / "inside", "f") == (root / "m" / "f").resolve()
    assert resolve_inside(root, root / "m" / "missing", "f") == (root / "m" / "missing").resolve()
    for name in ("abs-out", "rel-out"):
        with pytest.raises(PathEscape, match=f"f 'm/{name}' leads outside the model repository"):
            resolve_inside(root, root / "m" / name, "f")
    with pytest.raises(PathEscape):
        resolve_inside(root, root / "m" / "loop", "f")
    with pytest.raises(PathEscape):
        resolve_inside(root, root / ".." / "secret", "f")


def test_read_model_reports_an_escape_and_offers_no_version(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('backend: "python"\n')
    (tmp_path / "model.py").write_text("")
    os.symlink(tmp_path / "model.py", repo / "m" / "1" / "model.py")
    source = read_model(repo, "m")
    assert source.config is None and not source.versions
    assert "version 1 model file 'm/1/model.py' leads outside" in source.error


@pytest.mark.parametrize("name", ["libcustom.so", "/opt/lib/libcustom.so", "/models/m/libcustom.so", "/a/../b.so"])
def test_op_libraries_are_a_file_name_or_an_absolute_path(name: str) -> None:
    check_op_library_filename(name)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("lib/custom.so", "contains a path separator"),
        ("../custom.so", "contains a path separator"),
        (".custom.so", "starts with '.'"),
        ("", "is empty"),
        ("/opt/lib\ncustom.so", "contains a control character"),
    ],
)
def test_op_library_names_that_are_neither_fail(name: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="model_operations op_library_filename") as info:
        check_op_library_filename(name)
    assert problem in str(info.value)
    if not name.startswith("/"):
        assert "or an absolute path to a library outside the model repository" in str(info.value)


def test_op_library_path(tmp_path: Path) -> None:
    """The model's own files and files outside the repository; never another model's, through any symlink."""
    real_repo = tmp_path / "volume"
    for model in ("m", "other"):
        (real_repo / model).mkdir(parents=True)
        (real_repo / model / "lib.so").write_bytes(b"")
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "lib.so").write_bytes(b"")
    os.symlink(real_repo / "other" / "lib.so", tmp_path / "image" / "into-repo.so")
    os.symlink("../other/lib.so", real_repo / "m" / "theirs.so")
    repo = tmp_path / "models"  # the server's --model-repository is a symlink to the volume
    os.symlink(real_repo, repo)
    model = repo / "m"
    own = (real_repo / "m" / "lib.so").resolve()
    assert op_library_path(model, "lib.so") == own
    assert op_library_path(model, str(model / "lib.so")) == own
    assert op_library_path(model, str(real_repo / "m" / "lib.so")) == own
    assert op_library_path(model, str(tmp_path / "image" / "lib.so")) == (tmp_path / "image" / "lib.so").resolve()
    with pytest.raises(PathEscape, match="'theirs.so' leads outside the model's folder"):
        op_library_path(model, "theirs.so")
    for entry in (repo / "other" / "lib.so", real_repo / "other" / "lib.so", tmp_path / "image" / "into-repo.so"):
        with pytest.raises(ConfigError, match="leads into the model repository outside this model's folder"):
            op_library_path(model, str(entry))
    with pytest.raises(ConfigError, match="'missing.so': no such file in the model's folder"):
        op_library_path(model, "missing.so")
    with pytest.raises(ConfigError, match="no such file on the server"):
        op_library_path(model, str(tmp_path / "image"))
