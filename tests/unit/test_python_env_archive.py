"""What the ``EXECUTION_ENV_PATH`` unpacker keeps and the refusals the live tests do not reach
(tests/integration/test_python_env_archives.py has one model per refusal)."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest
from kubeinfer.server.backends.python.server_side import env_archive


def _archive(path: Path, *entries: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.GNU_FORMAT) -> Path:
    with tarfile.open(path, "w:gz", format=fmt) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(name: str, data: bytes | None = None, **fields: object) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    return info, data


def test_files_keep_their_permission_bits_and_time_without_set_id_and_hard_links_are_copies(tmp_path: Path) -> None:
    archive = _archive(
        tmp_path / "env.tgz",
        _info("bin/tool", b"#!/bin/sh\n", mode=0o6755, mtime=1_000_000),
        _info("bin/same", type=tarfile.LNKTYPE, linkname="bin/tool"),
        _info("lib64", type=tarfile.SYMTYPE, linkname="lib"),
        _info("lib/python3.11/x.py", b"x = 1\n"),
    )
    dest = tmp_path / "out"
    dest.mkdir()
    env_archive.unpack(archive, dest, "env.tgz", env_archive.Limits())
    tool = (dest / "bin" / "tool").stat()
    assert stat.S_IMODE(tool.st_mode) == 0o755 and tool.st_mtime == 1_000_000
    same = (dest / "bin" / "same").stat()
    assert (dest / "bin" / "same").read_bytes() == b"#!/bin/sh\n" and same.st_ino != tool.st_ino
    assert (dest / "lib64" / "python3.11" / "x.py").read_text() == "x = 1\n"


def test_a_header_that_would_be_held_in_memory_whole_is_refused_before_it_is_read(tmp_path: Path) -> None:
    info, _ = _info("lib/x", b"")
    info.pax_headers = {"comment": "a" * (env_archive.MAX_READ + 1)}  # gzip makes it a few KiB
    archive = _archive(tmp_path / "env.tgz", (info, b""), fmt=tarfile.PAX_FORMAT)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(env_archive.Refused, match="a tar header with more than"):
        env_archive.unpack(archive, dest, "env.tgz", env_archive.Limits())


def test_only_bin_python_may_point_out_of_the_folder(tmp_path: Path) -> None:
    for name, allowed in (("bin/python3.11", True), ("env/bin/python", True), ("lib/bin/x/python3", False)):
        archive = _archive(tmp_path / "env.tgz", _info(name, type=tarfile.SYMTYPE, linkname="/usr/bin/python3"))
        dest = tmp_path / name.replace("/", "_")
        dest.mkdir()
        if allowed:
            env_archive.unpack(archive, dest, "env.tgz", env_archive.Limits())
            assert (dest / name).is_symlink()
        else:
            with pytest.raises(env_archive.Refused, match="outside the environment folder"):
                env_archive.unpack(archive, dest, "env.tgz", env_archive.Limits())
