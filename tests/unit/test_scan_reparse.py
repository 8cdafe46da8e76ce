"""A poll of an unchanged model folder reuses the config parsed last time (``scan.read_model(parsed=...)``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubeinfer.server.repository import scan

CONFIG = 'name: "m"\nmax_batch_size: 4\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'


def _model(repo: Path, config: str) -> None:
    (repo / "m" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "m" / "1" / "model.onnx").write_bytes(b"onnx")
    (repo / "m" / "config.pbtxt").write_text(config)


def test_the_same_bytes_are_not_parsed_again_and_give_the_same_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _model(tmp_path, CONFIG)  # no platform: the read fills it in from the model file it finds
    first = scan.read_model(tmp_path, "m")
    assert first.config is not None and first.config.platform == "onnxruntime_onnx"
    assert first.parsed is not None and first.parsed.config.platform == ""  # the parse itself stays as read

    parses: list[str] = []
    real = scan.parse_config_text
    monkeypatch.setattr(scan, "parse_config_text", lambda text, source: parses.append(text) or real(text, source))
    again = scan.read_model(tmp_path, "m", parsed=first.parsed)
    assert parses == []
    assert again.config == first.config and again.config is not first.parsed.config
    assert again.config_digest == first.config_digest and again.versions == first.versions

    _model(tmp_path, CONFIG.replace("max_batch_size: 4", "max_batch_size: 8"))
    changed = scan.read_model(tmp_path, "m", parsed=first.parsed)
    assert len(parses) == 1 and changed.config is not None and changed.config.max_batch_size == 8
    assert changed.parsed is not None and changed.parsed.digest != first.parsed.digest


def test_a_broken_config_is_reported_whatever_was_parsed_before(tmp_path: Path) -> None:
    _model(tmp_path, CONFIG)
    first = scan.read_model(tmp_path, "m")
    _model(tmp_path, "max_batch_size: [")
    broken = scan.read_model(tmp_path, "m", parsed=first.parsed)
    assert broken.config is None and "failed to parse config.pbtxt" in broken.error
