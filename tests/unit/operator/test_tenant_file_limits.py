"""Tenant files read whole (issue #37): a tenant writes the folders the operator reads (hostPath/local volumes,
uploads), and a sparse file of any size or a folder of millions of entries costs it nothing. Every file the
operator reads there has a size limit (a larger one is stale and rewritten, never read) and every listing a cap
(a folder over it is a condition naming it). Real files on the test's folder throughout; the huge files are
sparse (``os.truncate``), so they cost no disk.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx
import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.onnx_check import check_onnx
from kubeinfer.operator.sources.quota import NamespaceQuota, folder_bytes
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER
from onnx import TensorProto

from tests.support.models import unary
from tests.unit.operator.test_repository_writer import NS, make_writer

HUGE = 50 << 30  # 50 GB, sparse


def _spec() -> dict[str, Any]:
    return {
        "server": "s",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": [{"version": 1, "source": {"path": "uploads/relu.onnx"}}],
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / NS / "uploads").mkdir(parents=True)
    onnx.save(unary("relu.onnx", "Relu", TensorProto.FLOAT, ["batch", 4]), tmp_path / NS / "uploads" / "relu.onnx")
    return tmp_path


@contextmanager
def _memory_cap(extra: int) -> Iterator[None]:
    """At most ``extra`` more bytes of address space inside: code that reads a 50 GB file whole fails at once
    with MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("planted", ["config.pbtxt", f"1/{SOURCE_MARKER}"])
def test_a_huge_sparse_config_or_source_marker_is_rewritten_unread(root: Path, planted: str) -> None:
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    model = render_model("m", _spec())
    writer.sync_model(server_dir, model)
    os.truncate(server_dir / "m" / planted, HUGE)
    with _memory_cap(256 << 20):
        result = writer.sync_model(server_dir, model)
    if planted == "config.pbtxt":
        assert result.config_changed and result.replaced_versions == []
        assert (server_dir / "m" / "config.pbtxt").read_text() == model.config_text
    else:
        assert result.replaced_versions == [1] and not result.config_changed
        assert (server_dir / "m" / planted).stat().st_size < 1024
    assert not writer.sync_model(server_dir, model).changed


def test_a_config_longer_than_the_rendered_one_is_replaced(root: Path) -> None:
    """The read is bounded by the rendered config's length: one byte more already differs."""
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    model = render_model("m", _spec())
    writer.sync_model(server_dir, model)
    (server_dir / "m" / "config.pbtxt").write_text(model.config_text + " ")
    assert writer.sync_model(server_dir, model).config_changed
    assert (server_dir / "m" / "config.pbtxt").read_text() == model.config_text


def _fill(folder: Path, n: int, prefix: str = "junk-") -> None:
    for i in range(n):
        (folder / f"{prefix}{i}").touch()


def test_a_model_folder_over_the_listing_cap_is_a_condition_and_can_still_be_removed(root: Path) -> None:
    writer = make_writer(root, max_entries=50)
    server_dir = writer.server_dir(NS, "ns/pool")
    model = render_model("m", _spec())
    writer.sync_model(server_dir, model)
    _fill(server_dir / "m", 60)
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, model)
    assert info.value.reason == "TooManyEntries"
    assert "'ns/pool/m' holds more than 50 entries" in info.value.message
    assert writer.snapshot(server_dir, "m") == ([], None)  # no fingerprint: every resync looks again
    assert writer.versions_on_disk(server_dir, "m") == []
    assert (server_dir / "m" / "config.pbtxt").read_text() == model.config_text  # what is served is untouched
    assert writer.remove_model(server_dir, "m") and not (server_dir / "m").exists()


def test_a_server_folder_over_the_listing_cap_is_a_condition(root: Path) -> None:
    writer = make_writer(root, max_entries=50)
    server_dir = writer.server_dir(NS, "ns/pool")
    _fill(server_dir, 60, prefix=".junk-")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("m", _spec()))
    assert info.value.reason == "TooManyEntries" and "'ns/pool' holds more than 50 entries" in info.value.message
    assert not (server_dir / "m").exists()


def test_the_quota_walk_stops_at_its_cap_and_refuses(tmp_path: Path) -> None:
    uploads = tmp_path / "a" / "uploads"
    uploads.mkdir(parents=True)
    (uploads / "model.onnx").write_bytes(b"x" * 100)
    assert folder_bytes(tmp_path / "a", max_entries=50) == 100
    _fill(uploads, 60)
    assert folder_bytes(tmp_path / "a", max_entries=50) is None
    quota = NamespaceQuota(tmp_path, default=10 << 20, ttl=3600, max_entries=50)
    for _ in range(2):
        with pytest.raises(ArtifactError) as info:
            quota.check("a")
        assert info.value.reason == "QuotaExceeded" and "more than 50 files and folders" in info.value.message
    assert quota.walks == 1  # the verdict is kept for the ttl like a measured usage


def test_the_onnx_check_of_a_fifo_path_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    config = render_model("m", _spec()).config
    done: list[list[str]] = []
    worker = threading.Thread(target=lambda: done.append(check_onnx(fifo, config, 1)), daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # blocked opening the FIFO: a writer that closes at once lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
    assert done and "not a regular file" in done[0][0], done
