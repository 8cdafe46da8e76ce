"""``--model-config-name``: which file a model's config is read from (``repository.config_name``, ``scan``).

Triton's rule (core ``GetModelConfigFullPath``; docs "Custom Model Configuration"): ``configs/<name>.pbtxt``
when it exists, else ``config.pbtxt``, else no config (auto-complete); a custom config that exists but does
not parse fails the model with ``failed to read text proto from <path>``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubeinfer.server.cli import build_parser, compat_notices, settings_from_args
from kubeinfer.server.repository import scan
from kubeinfer.server.repository.config_name import check_config_name, config_files

BASE = 'max_batch_size: {n}\ninput [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]\n'


def _model(repo: Path, name: str, config: str | None = None, custom: dict[str, str] | None = None) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"onnx")
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    if custom:
        (folder / "configs").mkdir()
        for file, text in custom.items():
            (folder / "configs" / f"{file}.pbtxt").write_text(text)
    return folder


def test_the_custom_config_wins_where_it_exists_else_config_pbtxt(tmp_path: Path) -> None:
    _model(tmp_path, "a", BASE.format(n=1), {"h100": BASE.format(n=8), "v100": BASE.format(n=2)})
    _model(tmp_path, "b", BASE.format(n=3), {"v100": BASE.format(n=2)})
    _model(tmp_path, "c", None, {"h100": BASE.format(n=5)})  # no config.pbtxt at all
    _model(tmp_path, "d", None)  # nothing: auto-complete, as without the flag

    def max_batch(name: str, config_name: str) -> int | None:
        source = scan.read_model(tmp_path, name, config_name=config_name)
        assert not source.error, source.error
        assert source.config is not None
        return source.config.max_batch_size if source.config.HasField("max_batch_size") else None

    assert [max_batch(n, "h100") for n in "abcd"] == [8, 3, 5, None]
    assert [max_batch(n, "") for n in "abd"] == [1, 3, None]  # without the flag: config.pbtxt only
    assert max_batch("a", "v100") == 2


def test_the_digest_follows_the_file_read_so_a_poll_sees_a_custom_config_change(tmp_path: Path) -> None:
    folder = _model(tmp_path, "a", BASE.format(n=1), {"h100": BASE.format(n=8)})
    before = scan.read_model(tmp_path, "a", config_name="h100")
    (folder / "configs" / "h100.pbtxt").write_text(BASE.format(n=4))
    after = scan.read_model(tmp_path, "a", config_name="h100", parsed=before.parsed)
    assert after.config_digest != before.config_digest
    assert after.config is not None and after.config.max_batch_size == 4
    (folder / "configs" / "h100.pbtxt").unlink()  # removed: back to config.pbtxt
    back = scan.read_model(tmp_path, "a", config_name="h100", parsed=after.parsed)
    assert back.config is not None and back.config.max_batch_size == 1 and back.config_digest != after.config_digest


def test_a_malformed_custom_config_fails_the_model_in_tritons_words(tmp_path: Path) -> None:
    _model(tmp_path, "a", BASE.format(n=1), {"h100": "max_batch_size: ["})
    source = scan.read_model(tmp_path, "a", config_name="h100")
    assert source.config is None
    path = tmp_path / "a" / "configs" / "h100.pbtxt"
    assert source.error.startswith(f"failed to read text proto from {path}: 1:")  # not a fallback to config.pbtxt


def test_a_custom_config_that_is_a_folder_is_not_read_past(tmp_path: Path) -> None:
    folder = _model(tmp_path, "a", BASE.format(n=1))
    (folder / "configs" / "h100.pbtxt").mkdir(parents=True)
    source = scan.read_model(tmp_path, "a", config_name="h100")
    assert source.config is None and source.error.startswith("cannot read configs/h100.pbtxt")


@pytest.mark.parametrize("bad", ["", "a/b", "../x", ".hidden", "h 100", "x\n", "n" * 260])
def test_a_name_that_is_not_plain_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="empty argument for --model-config-name" if not bad else "plain name"):
        check_config_name(bad)


def test_names_and_files() -> None:
    check_config_name("h100")
    check_config_name("config")  # Triton's example 2: configs/config.pbtxt
    assert config_files("h100") == ("configs/h100.pbtxt", "config.pbtxt")
    assert config_files("") == ("config.pbtxt",)


def test_the_flag_is_taken_and_an_empty_one_refused_with_tritons_text(tmp_path: Path) -> None:
    parser = build_parser(triton=True)
    args = parser.parse_args(["--model-repository", str(tmp_path), "--model-config-name=h100"])
    assert compat_notices(args) == ([], [])
    assert settings_from_args(args, triton=True).model_config_name == "h100"
    assert settings_from_args(parser.parse_args(["--model-repository", str(tmp_path)]), True).model_config_name == ""
    empty = parser.parse_args(["--model-repository", str(tmp_path), "--model-config-name="])
    with pytest.raises(ValueError, match="^empty argument for --model-config-name$"):
        settings_from_args(empty, triton=True)
