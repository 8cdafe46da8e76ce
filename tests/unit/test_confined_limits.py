"""``repository.confined``'s limits: ``read_bytes(max_bytes=)`` refuses a larger file by its size, before reading
it, and ``names(limit=)`` stops listing past the cap (issue #37: tenants' sparse files and huge folders)."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest
from kubeinfer.server.repository import confined


def test_read_bytes_refuses_a_huge_sparse_file_before_reading_it(tmp_path: Path) -> None:
    (tmp_path / "small").write_bytes(b"12345")
    with (tmp_path / "huge").open("wb") as huge:
        huge.truncate(50 << 30)  # sparse: no disk
    with confined.opened(confined.open_root(tmp_path)) as root:
        assert confined.read_bytes(root, "small", max_bytes=5) == b"12345"
        with pytest.raises(confined.OverLimit) as info:
            confined.read_bytes(root, "small", max_bytes=4)
        assert info.value.errno == errno.EFBIG and "'small' is larger than 4 bytes" in str(info.value)
        started = time.monotonic()
        with pytest.raises(confined.OverLimit):
            confined.read_bytes(root, "huge", max_bytes=64 << 10)
        assert time.monotonic() - started < 1.0
        assert confined.read_bytes(root, "small") == b"12345"  # no limit: as before


def test_names_stops_past_its_limit(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / str(i)).touch()
    with confined.opened(confined.open_root(tmp_path)) as root:
        assert sorted(confined.names(root, 10)) == [str(i) for i in range(10)]
        assert len(confined.names(root)) == 10
        with pytest.raises(confined.OverLimit, match="more than 9 entries"):
            confined.names(root, 9)
