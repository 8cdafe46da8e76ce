"""Tar archives that are bombs, built cheaply (issue #37): what a tenant hands the operator as a folder model's
archive. Used by the unit tests of ``operator/sources/archives.py`` and the tenant drill (e2e/test_tenant_drill.py).

The zero bombs are real gzip streams: one small gzip member per MiB of zeros, concatenated (gzip readers take the
members as one stream), so an 8 GiB bomb costs 8 MB and no compression time to build.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

MIB = 1 << 20
_ZEROS_MIB = gzip.compress(bytes(MIB), compresslevel=9)


def tar_header(name: str, size: int) -> bytes:
    """A tar header for a file ``name`` of ``size`` bytes (GNU format: base-256 sizes, 8 GiB and more)."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT)


def zeros_tgz(path: Path, files: list[tuple[str, int]], *, end: bool = True) -> Path:
    """A .tgz of files of zeros (sizes whole MiB), written as gzip members; without ``end`` it stops after the
    last header (no data, no end-of-archive blocks)."""
    with path.open("wb") as out:
        for i, (name, size) in enumerate(files):
            out.write(gzip.compress(tar_header(name, size)))
            if not end and i == len(files) - 1:
                return path
            assert size % MIB == 0
            for _ in range(size // MIB):
                out.write(_ZEROS_MIB)
        out.write(gzip.compress(bytes(2 * tarfile.BLOCKSIZE)))
    return path


def pax_tgz(path: Path, header_bytes: int) -> Path:
    """A .tgz of one small ``saved_model.pb`` whose pax header carries a ``header_bytes`` comment (tarfile holds a
    pax record whole while it parses it): a few KiB per MiB of header."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=1) as tar:
        info = tarfile.TarInfo("saved_model.pb")
        info.size, info.pax_headers = 5, {"comment": "x" * header_bytes}
        tar.addfile(info, io.BytesIO(b"graph"))
    return path
