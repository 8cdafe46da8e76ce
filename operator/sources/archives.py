"""A version's model folder delivered as one tar archive (a TensorFlow SavedModel: ``saved_model.pb``,
``variables/``, ``assets/``), unpacked beneath a descriptor by the operator's rules.

The archive may hold the folder's contents at its root (``tar -C model.savedmodel -czf model.tgz .``) or
in one top folder (``tar -czf model.tgz model.savedmodel``); plain, gzip, bzip2 and xz tars are read
(told apart by their first bytes). Only regular files and folders are taken: an absolute name, a ``..``, a
link (symbolic or hard), a device or a FIFO refuses the whole archive, as does more than ``max_bytes``
unpacked or more than ``MAX_MEMBERS`` entries. Every folder and file is made with the confined
primitives (``mkdirat``/``O_EXCL|O_NOFOLLOW`` beneath the staged version folder), never by path.

Archive bombs: a compressed tar of a few KiB may decompress to terabytes, and ``tarfile`` reads whatever
its walk needs. So the decompressor is opened here and tarfile reads it, in order and forward only,
through ``_Meter``, which counts every decompressed byte and checks the deadline and cancellation before
each read. An entry whose declared size passes what is left of ``max_bytes`` is refused from its header,
before its data is read; between two entries tarfile may read the entry's data plus ``MAX_ENTRY_HEADERS``
(a pax record or a GNU long name is held in memory whole while it is parsed), and ``MAX_HEADERS`` in all.
Two passes, as tarfile's own seeks made before: the first checks every entry and writes nothing, the
second writes.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import tarfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Protocol, TypeVar

from kubeinfer.server.repository import confined

from .artifacts import CHUNK, ArtifactError

_T = TypeVar("_T")


class _Readable(Protocol):
    """What the meter reads: a plain archive file, or a decompressor (``GzipFile``, ``BZ2File``, ``LZMAFile``)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


MAX_MEMBERS = 100_000
#: bytes of headers one entry may bring (its 512-byte header, a pax record, a GNU long name or link name):
#: a real entry's are under 10 KiB (a Linux path is at most 4 KiB); tarfile holds them whole while it parses
MAX_ENTRY_HEADERS = 64 << 10
#: bytes of headers a whole archive may bring: MAX_MEMBERS plain 512-byte headers take 49 MiB, the rest leaves
#: room for long names; bounds the time a walk of headers alone takes and what tarfile keeps of them
MAX_HEADERS = 64 << 20
#: bytes read at a time when tarfile skips forward (an entry's data in the first pass)
BUFSIZE = 64 << 10

#: first bytes of the compressed formats, and how to open each as a stream of the tar's bytes
_FORMATS: tuple[tuple[bytes, Callable[[BinaryIO], _Readable]], ...] = (
    (b"\x1f\x8b", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
    (b"BZh", lambda f: bz2.BZ2File(f, "rb")),
    (b"\xfd7zXZ\x00", lambda f: lzma.LZMAFile(f, "rb")),
)
#: bytes a compressed archive may hold after its tar's end marker (tar pads to 10240-byte records)
MAX_TRAILING = 1 << 20
#: what a damaged compressed stream raises (bz2 and gzip raise OSError without an errno, or EOFError)
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)


def _blocks(size: int) -> int:
    """Bytes ``size`` bytes of entry data take in the archive (padded to 512-byte blocks)."""
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


class _Meter(io.RawIOBase):
    """The tar's decompressed bytes as tarfile reads them (forward only), each read checked first.

    Read sequentially, tarfile asks for exactly the bytes it needs: a header block, a pax record or long name
    whole, an entry's data, and skips forward with ``seek``, which reads and drops through ``read``.
    ``grant(size)`` is called for each entry tarfile yields: until the next one, tarfile may read that entry's
    data (``size``), its padding and the next entry's headers; a read past that, or past MAX_HEADERS of headers
    in all, is refused before anything of it is decompressed. Every read first asks ``cancelled`` (the model
    went away) and the clock (``deadline``, monotonic), so neither waits for a bomb to be decompressed.
    """

    def __init__(
        self,
        inner: _Readable,
        shown: str,
        deadline: float | None,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.shown = shown
        self.deadline = deadline
        self.cancelled = cancelled
        self.pos = 0  # bytes read
        self.data = 0  # bytes of entries' data granted
        self.step = 0  # bytes tarfile may still read before it yields the next entry
        self.grant(0)

    def readable(self) -> bool:
        return True

    def grant(self, size: int) -> None:
        self.data += _blocks(size)
        self.step = _blocks(size) + MAX_ENTRY_HEADERS

    def read(self, size: int = -1, /) -> bytes:
        """``size`` bytes (fewer only at the end), after the checks; the decompressor's own bytes, without the
        copy ``RawIOBase.read`` makes through ``readinto``."""
        if self.cancelled is not None and self.cancelled():
            raise ArtifactError("Cancelled", f"unpacking {self.shown} cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise ArtifactError(
                "DeadlineExceeded",
                f"unpacking {self.shown} did not finish within the operator's limit per download "
                "(its --fetch-deadline)",
            )
        size = BUFSIZE if size < 0 else size
        if size > min(self.step, MAX_HEADERS - (self.pos - self.data)):
            raise ArtifactError(
                "TooLarge",
                f"{self.shown} has entry headers (pax records, long names) over the operator's limit of "
                f"{MAX_ENTRY_HEADERS} bytes per entry and {MAX_HEADERS} bytes in all",
            )
        data = self.inner.read(size)
        self.pos += len(data)
        self.step -= len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET, /) -> int:
        """Forward only, by reading (each read checked) and dropping; tarfile never goes back when it reads in
        order, so going back is an unreadable archive."""
        target = offset if whence == os.SEEK_SET else self.pos + offset if whence == os.SEEK_CUR else -1
        if target < self.pos:
            raise io.UnsupportedOperation(f"seek from byte {self.pos} back to {target}")
        while self.pos < target:
            if not self.read(min(BUFSIZE, target - self.pos)):
                break  # the end: tarfile's next read finds it
        return self.pos


@dataclass(frozen=True)
class _Entry:
    """An entry as the first pass saw it: the second must see the same, in the same order."""

    name: str
    parts: list[str]
    size: int
    is_dir: bool


def _open(raw: BinaryIO) -> _Readable:
    """The tar's bytes of the archive file ``raw``: decompressed when its first bytes name a format."""
    raw.seek(0)
    magic = raw.read(8)
    raw.seek(0)
    for prefix, opener in _FORMATS:
        if magic.startswith(prefix):
            return opener(raw)
    return raw


def _entry(member: tarfile.TarInfo, shown: str) -> _Entry:
    """What is taken of ``member``; ArtifactError for a name that could leave the folder or anything but a file
    or a folder (the archive's own ``./`` is passed over, whatever it is)."""
    parts = _name(member, shown)
    if parts and not (member.isfile() or member.isdir()):
        raise ArtifactError(
            "ArchiveRejected",
            f"{shown}: entry '{member.name}' is {_kind(member)}; a model folder archive holds only files and folders",
        )
    return _Entry(member.name, parts, member.size if member.isfile() else 0, member.isdir())


def _name(member: tarfile.TarInfo, shown: str) -> list[str]:
    """The member's path components; ArtifactError for names that could leave the folder."""
    name = member.name
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\\" in name or "\0" in name:
        raise ArtifactError("ArchiveRejected", f"{shown}: entry '{name}' leads outside the model folder")
    return parts


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "not a regular file"


def unpack(
    archive_fd: int,
    dest_fd: int,
    *,
    shown: str,
    max_bytes: int,
    cancelled: Callable[[], bool] | None = None,
    deadline: float | None = None,
) -> int:
    """Unpack the tar archive open as ``archive_fd`` into the empty folder ``dest_fd``; returns the bytes
    written. ``shown`` names the archive in messages (``version 1: source.uri '...'``); ``cancelled`` and
    ``deadline`` (``time.monotonic()`` time) are checked before every read of the decompressed stream."""
    try:
        entries = _stream(
            archive_fd, shown, deadline, cancelled, lambda tar, meter: _check(tar, meter, shown, max_bytes)
        )
        tops = {e.parts[0] for e in entries}
        # one top folder holding everything (``tar -czf m.tgz model.savedmodel``): its contents are the model folder
        strip = len(tops) == 1 and all(len(e.parts) > 1 or e.is_dir for e in entries)
        return _stream(
            archive_fd,
            shown,
            deadline,
            cancelled,
            lambda tar, meter: _write(tar, meter, entries, dest_fd, shown, max_bytes, strip, cancelled),
        )
    except (*_CORRUPT, OSError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, tarfile.TarError) and exc.errno is not None:
            raise
        raise ArtifactError(
            "ArchiveRejected", f"{shown} is not a readable tar archive ({exc}); pack the model folder with tar"
        ) from None


def _stream(
    archive_fd: int,
    shown: str,
    deadline: float | None,
    cancelled: Callable[[], bool] | None,
    work: Callable[[tarfile.TarFile, _Meter], _T],
) -> _T:
    """``work`` on the archive read once from its start, in order, through a fresh ``_Meter``; then a compressed
    stream is read to its end, so that its own check (gzip's and bzip2's CRC, xz's check) has run: tarfile stops at
    the archive's end marker, before the trailer, and damage inside stored data would otherwise go unseen."""
    with os.fdopen(os.dup(archive_fd), "rb") as raw, contextlib.closing(_open(raw)) as tar_bytes:
        meter = _Meter(tar_bytes, shown, deadline, cancelled)
        with tarfile.open(fileobj=meter, mode="r:") as tar:
            result = work(tar, meter)
        if tar_bytes is not raw:
            _drain(meter, shown)
        return result


def _drain(meter: _Meter, shown: str) -> None:
    """The rest of a compressed stream after the tar's end (its record padding), read through to the trailer;
    more than MAX_TRAILING bytes there is refused rather than decompressed."""
    left = MAX_TRAILING
    while True:
        if meter.cancelled is not None and meter.cancelled():
            raise ArtifactError("Cancelled", f"unpacking {meter.shown} cancelled")
        data = meter.inner.read(min(BUFSIZE, left + 1))
        if not data:
            return
        left -= len(data)
        if left < 0:
            raise ArtifactError(
                "ArchiveRejected", f"{shown} holds more than {MAX_TRAILING} bytes after the end of its tar archive"
            )


def _check(tar: tarfile.TarFile, meter: _Meter, shown: str, max_bytes: int) -> list[_Entry]:
    """The first pass: every entry checked from its header, nothing written. An entry whose declared size
    passes what is left of ``max_bytes`` is refused before tarfile reads (or skips) its data."""
    entries: list[_Entry] = []
    declared = 0
    for member in tar:
        entry = _entry(member, shown)
        if len(entries) >= MAX_MEMBERS:
            raise ArtifactError("ArchiveRejected", f"{shown} holds more than {MAX_MEMBERS} entries")
        if declared + entry.size > max_bytes:
            raise ArtifactError(
                "TooLarge",
                f"{shown} unpacks to more than the limit of {max_bytes} bytes: entry '{entry.name}' declares "
                f"{entry.size} bytes and {max_bytes - declared} are left",
            )
        declared += entry.size
        meter.grant(entry.size)
        entries.append(entry)
    return [e for e in entries if e.parts]  # the archive's own "./"


def _write(
    tar: tarfile.TarFile,
    meter: _Meter,
    entries: list[_Entry],
    dest_fd: int,
    shown: str,
    max_bytes: int,
    strip: bool,
    cancelled: Callable[[], bool] | None,
) -> int:
    """The second pass: the entries the first one checked (the same again, or the archive is refused) written
    beneath ``dest_fd``, counted again as they are written."""
    expected = iter(entries)
    written = 0
    for member in tar:
        entry = _entry(member, shown)
        if entry.parts and entry != next(expected, None):
            raise ArtifactError("ArchiveRejected", f"{shown} changed while it was unpacked")
        meter.grant(entry.size)
        parts = entry.parts[1:] if strip else entry.parts
        if not parts:
            continue
        if cancelled is not None and cancelled():
            raise ArtifactError("Cancelled", f"unpacking {shown} cancelled")
        if entry.is_dir:
            os.close(confined.open_dir(dest_fd, "/".join(parts), create=True))
            continue
        folder = "/".join(parts[:-1])
        with confined.opened(confined.open_dir(dest_fd, folder, create=True) if folder else os.dup(dest_fd)) as at:
            source = tar.extractfile(member)
            if source is None:  # pragma: no cover - isfile() members always have data
                continue
            try:
                out = confined.create_new(at, parts[-1], mode=0o644)
            except FileExistsError:
                raise ArtifactError("ArchiveRejected", f"{shown}: entry '{member.name}' appears twice") from None
            with confined.opened(out), source:
                while chunk := source.read(CHUNK):
                    written += len(chunk)
                    if written > max_bytes:
                        raise ArtifactError("TooLarge", f"{shown} unpacks to more than the limit of {max_bytes} bytes")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                os.fsync(out)
    confined.fsync_dir(dest_fd)
    return written
