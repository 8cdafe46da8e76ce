"""A ``source.path`` over the byte limit is refused from its size, before anything is copied (issue #37): a sparse
file of any size costs the tenant nothing, while copying it up to the limit (20 GiB by default) would write that
much real disk on the volume and hash it first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch

from tests.unit.operator.test_repository_writer import NS, make_writer


def _spec(path: str) -> dict[str, Any]:
    return {
        "server": "s",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": [{"version": 1, "source": {"path": path}}],
    }


def test_a_sparse_source_path_over_the_limit_is_refused_before_any_copy(tmp_path: Path) -> None:
    (tmp_path / NS / "uploads").mkdir(parents=True)
    huge = tmp_path / NS / "uploads" / "huge.onnx"
    huge.touch()
    os.truncate(huge, 50 << 30)  # 50 GB, sparse: no disk
    writer = make_writer(tmp_path, max_bytes=1 << 30)
    server_dir = writer.server_dir(NS, "ns/pool")
    copied: list[bool] = []

    def cancelled() -> bool:  # asked before each chunk is copied: one asked means the copy began
        copied.append(True)
        return True

    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", _spec("uploads/huge.onnx")), fetch=Fetch(cancelled=cancelled))
    assert info.value.reason == "TooLarge"
    assert "source.path 'uploads/huge.onnx' is larger than the operator's limit of 1073741824 bytes" in str(
        info.value.message
    )
    assert copied == []
    assert not (server_dir / "m").exists()
