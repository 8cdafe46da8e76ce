"""Archive bombs (issue #37): a folder model's tar archive is unpacked with every decompressed byte counted as it
is read, so a few KiB that expand to gigabytes are refused at the limit, the deadline and cancellation stop the
work between any two reads, and a ``source.path`` archive takes a download slot like a download.

The bombs are real gzip streams: one small gzip member per MiB of zeros, concatenated (gzip readers take the
members as one stream), so an 8 GiB bomb costs 8 MB and no compression time to build.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources import archives
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch, Fetcher
from kubeinfer.operator.sources.quota import DownloadGate
from kubeinfer.server.repository import confined

from tests.support.archive_bombs import tar_header as _header
from tests.support.archive_bombs import zeros_tgz as _bomb
from tests.unit.operator.test_repository_writer import NS, make_writer

MIB = 1 << 20
GIB = 1 << 30
#: an unpack that reads only a few MiB of a bomb ends in well under this; decompressing the bomb takes far longer
QUICK = 3.0


def _unpack(archive: Path, dest: Path, **kw: object) -> int:
    dest.mkdir(exist_ok=True)
    with confined.opened(os.open(archive, os.O_RDONLY)) as fd, confined.opened(confined.open_root(dest)) as out:
        return archives.unpack(fd, out, shown="source.path 'bomb.tgz'", **kw)  # type: ignore[arg-type]


def _refused(archive: Path, dest: Path, **kw: object) -> tuple[ArtifactError, float]:
    started = time.monotonic()
    with pytest.raises(ArtifactError) as info:
        _unpack(archive, dest, **kw)
    return info.value, time.monotonic() - started


def test_one_huge_entry_is_refused_by_its_declared_size_at_once(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "bomb.tgz", [("saved_model.pb", 8 * GIB)])
    assert bomb.stat().st_size < 16 * MIB
    error, took = _refused(bomb, tmp_path / "out", max_bytes=MIB)
    assert error.reason == "TooLarge" and took < QUICK
    assert "unpacks to more than the limit of 1048576 bytes" in error.message and "'saved_model.pb'" in error.message
    assert os.listdir(tmp_path / "out") == []


def test_entries_spread_far_apart_are_refused_once_their_sizes_pass_the_limit(tmp_path: Path) -> None:
    """Every entry fits the limit by itself; the second one's declared size passes what is left of it: refused
    after reading about one entry, not the 8 GiB the headers are spread over."""
    bomb = _bomb(tmp_path / "bomb.tgz", [(f"variables/part-{i}", 128 * MIB) for i in range(64)])
    error, took = _refused(bomb, tmp_path / "out", max_bytes=200 * MIB)
    assert error.reason == "TooLarge" and took < QUICK, took
    assert "'variables/part-1'" in error.message
    assert os.listdir(tmp_path / "out") == []


def test_an_entry_over_what_is_left_is_refused_before_its_data_is_read(tmp_path: Path) -> None:
    """The second entry declares 1 GiB and the archive ends right after its header: no data was there to read,
    and the refusal is about the size, not a truncated archive."""
    archive = tmp_path / "cut.tgz"
    archive.write_bytes(
        gzip.compress(_header("saved_model.pb", 512) + bytes(512) + _header("variables/variables.data", GIB))
    )
    error, _ = _refused(archive, tmp_path / "out", max_bytes=MIB)
    assert error.reason == "TooLarge" and "'variables/variables.data'" in error.message
    assert f"declares {GIB} bytes" in error.message


def test_a_huge_pax_header_is_refused_without_holding_it(tmp_path: Path) -> None:
    """Headers are bounded too: a 16 MiB pax record (tarfile would hold it in memory whole) is refused at the
    per-entry header limit, although the unpacked files are tiny."""
    archive = tmp_path / "pax.tgz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=1) as tar:
        info = tarfile.TarInfo("saved_model.pb")
        info.size, info.pax_headers = 5, {"comment": "x" * (16 * MIB)}
        tar.addfile(info, io.BytesIO(b"graph"))
    error, took = _refused(archive, tmp_path / "out", max_bytes=GIB)
    assert error.reason == "TooLarge" and "headers" in error.message and took < QUICK


def test_a_deadline_in_the_past_stops_the_unpacking(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "bomb.tgz", [("saved_model.pb", 4 * MIB)])
    error, _ = _refused(bomb, tmp_path / "out", max_bytes=GIB, deadline=time.monotonic() - 1)
    assert error.reason == "DeadlineExceeded" and "source.path 'bomb.tgz'" in error.message


def test_cancellation_stops_the_unpacking_between_two_reads(tmp_path: Path) -> None:
    """An 8 GiB entry within the limit: decompressing it takes many seconds; the model's deletion (the cancel
    flag, set from another thread as the model watch does) stops it at once."""
    bomb = _bomb(tmp_path / "bomb.tgz", [("saved_model.pb", 8 * GIB)])
    gone = threading.Event()
    timer = threading.Timer(0.2, gone.set)
    timer.start()
    try:
        error, took = _refused(bomb, tmp_path / "out", max_bytes=16 * GIB, cancelled=gone.is_set)
    finally:
        timer.cancel()
    assert error.reason == "Cancelled" and took < QUICK, took


def test_headers_of_all_entries_together_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry's pax record is within the per-entry limit; together they pass the archive's (lowered here
    to 1 MiB: the default is 64 MiB)."""
    monkeypatch.setattr(archives, "MAX_HEADERS", MIB)
    archive = tmp_path / "many.tgz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=1) as tar:
        for i in range(100):
            info = tarfile.TarInfo(f"assets/{i}")
            info.pax_headers = {"comment": "x" * (16 << 10)}
            tar.addfile(info, io.BytesIO(b""))
    error, _ = _refused(archive, tmp_path / "out", max_bytes=GIB)
    assert error.reason == "TooLarge" and f"{MIB} bytes in all" in error.message


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_real_archives_up_to_the_limit_unpack_in_every_format(tmp_path: Path, mode: str) -> None:
    """Legitimate archives are unchanged: long names (pax records) included, a total of exactly the limit fits."""
    long_name = "assets/" + "v" * 200 + ".txt"
    files = {"saved_model.pb": b"g" * 1000, "variables/variables.index": b"i" * 24, long_name: b"x" * 1024}
    archive = tmp_path / "sm.tar"
    with tarfile.open(archive, mode, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    limit = sum(len(d) for d in files.values())
    assert _unpack(archive, tmp_path / "out", max_bytes=limit) == limit
    assert {str(p.relative_to(tmp_path / "out")): p.read_bytes() for p in (tmp_path / "out").rglob("*.*")} == {
        k: v for k, v in files.items() if "." in Path(k).name
    }
    error, _ = _refused(archive, tmp_path / "again", max_bytes=limit - 1)
    assert error.reason == "TooLarge"


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
def test_a_damaged_compressed_stream_is_an_unreadable_archive(tmp_path: Path, mode: str) -> None:
    archive = tmp_path / "sm.tar"
    with tarfile.open(archive, mode) as tar:  # type: ignore[call-overload]
        info = tarfile.TarInfo("saved_model.pb")
        data = os.urandom(64 << 10)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    packed = bytearray(archive.read_bytes())
    packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)
    archive.write_bytes(bytes(packed))
    error, _ = _refused(archive, tmp_path / "out", max_bytes=GIB)
    assert error.reason == "ArchiveRejected" and "is not a readable tar archive" in error.message


# ------------------------------------------------------------------------------------ through the writer
def _archive(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("saved_model.pb", b"graph" * 100), ("variables/variables.index", b"index")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _spec(path: str) -> dict[str, Any]:
    return {"server": "s", "platform": "tensorflow_savedmodel", "versions": [{"version": 1, "source": {"path": path}}]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _archive(tmp_path / NS / "uploads" / "sm.tgz")
    return tmp_path


def test_a_source_path_archive_takes_a_download_slot_and_releases_it(root: Path) -> None:
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    model = render_model("tfm", _spec("uploads/sm.tgz"))
    gate = DownloadGate(per_namespace=1, total=1)
    gate.acquire(NS)  # another download of the namespace holds its only slot
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, model, fetch=Fetch(gate=gate))
    assert info.value.reason == "Queued"
    assert not (server_dir / "tfm").exists()
    gate.release(NS)
    seen: list[int] = []

    def cancelled() -> bool:  # asked between reads: records whether the slot is held meanwhile
        seen.append(gate.running(NS))
        return False

    fetch = Fetch(gate=gate, cancelled=cancelled)
    assert writer.sync_model(server_dir, model, fetch=fetch).added_versions == [1]
    fetch.finish(True)
    assert seen and set(seen) == {1} and gate.running() == 0  # held while unpacking, released by finish


def test_the_fetch_deadline_bounds_a_source_path_archive(root: Path) -> None:
    writer = make_writer(root, fetcher=Fetcher(deadline=0.0))
    server_dir = writer.server_dir(NS, "ns/pool")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("tfm", _spec("uploads/sm.tgz")))
    assert info.value.reason == "DeadlineExceeded" and info.value.version == 1
    assert not (server_dir / "tfm").exists()
