"""Unpacking an ``EXECUTION_ENV_PATH`` tarball within the limits the operator puts on model archives.

The tarball comes with a model, and the server unpacks it, in its own process, into a cache shared by
every model that names the same bytes. So it gets the limits of ``operator/sources/archives.py``, adapted to what
an environment holds (conda-pack and venv-pack tarballs are full of symlinks):

* size: the archive file at most ``max_bytes``; the tar stream it decompresses to is counted on every
  read and refused past ``max_bytes`` (a gzip bomb costs at most that much CPU and no more disk), and no
  single read of it may ask for more than ``MAX_READ`` (a tar header that declares a huge long name or
  pax record cannot make ``tarfile`` hold it in memory);
* entries: at most ``max_entries``;
* names: no absolute path, no ``..``;
* kinds: files, folders, symlinks and hard links; a device, a FIFO or anything else refuses the archive;
* links: a symlink must lead to a place inside the folder: checked on its text as it is made, and by
  resolving every one through the others once all are there (a chain such as ``a -> .`` and
  ``b -> a/..`` cannot climb out). One exception: ``[<top>/]bin/python*`` may point at an absolute path
  (the base interpreter a packed virtualenv runs: venv-pack leaves it outside), and another such link
  may lead to it (``python -> python3``); the archive could ship any program as ``bin/python3``
  anyway, so this grants nothing. A hard link must name an earlier file of the archive; its bytes are
  copied (and counted).

Nothing is written by path: every folder, file and link is made beneath the staging folder's descriptor
one component at a time, never through a symlink (``repository.confined``), so no entry and no link the
archive made earlier can put a byte outside it. Files keep their permission bits (``bin/python3`` stays
executable) without set-id bits, and their modification time (Python compares it with a ``.pyc``'s).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....repository import confined

#: the operator's limits for a model archive (operator/sources/artifacts.py, operator/sources/archives.py)
DEFAULT_MAX_BYTES = 20 << 30
DEFAULT_MAX_ENTRIES = 100_000
#: the most one read of the decompressed stream may ask for (tarfile reads a header's extra data at once)
MAX_READ = 16 << 20
_CHUNK = 1 << 20
#: a packed virtualenv's interpreter, the one link that may lead outside: ``[<top>/]bin/python[3[.N]]``
_INTERPRETER = re.compile(r"python(3(\.\d+)?)?")


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_entries: int = DEFAULT_MAX_ENTRIES


class Refused(Exception):
    """The archive breaks a limit or holds what an environment must not; the message says which."""


class _Counted:
    """The decompressed tar stream, read forward only and counted: ``tarfile`` reads it as a file."""

    def __init__(self, raw: io.BufferedIOBase, shown: str, max_bytes: int) -> None:
        self.raw = raw
        self.shown = shown
        self.max_bytes = max_bytes
        self.position = 0

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > MAX_READ:
            raise Refused(f"{self.shown} holds a tar header with more than {MAX_READ} bytes of extra data")
        if self.position + size > self.max_bytes:
            size = self.max_bytes + 1 - self.position  # one byte past the limit tells "more" from "exactly"
        data = self.raw.read(size)
        self.position += len(data)
        if self.position > self.max_bytes:
            raise Refused(f"{self.shown} unpacks to more than the limit of {self.max_bytes} bytes")
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset if whence == os.SEEK_SET else self.position + offset
        if whence not in (os.SEEK_SET, os.SEEK_CUR) or target < self.position:
            raise OSError(f"{self.shown}: the archive is read once, forward")
        while self.position < target:  # skipping is reading: counted the same
            if not self.read(min(_CHUNK, target - self.position)):
                break
        return self.position

    def tell(self) -> int:
        return self.position


def _decompressed(path: Path) -> io.BufferedIOBase:
    """The archive's tar stream: gzip, bzip2 and xz told apart by their first bytes, as ``tarfile`` does."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(path, "rb")
    if magic.startswith(b"BZh"):
        return bz2.open(path, "rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(path, "rb")
    return open(path, "rb")


def _parts(name: str, shown: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or "\0" in name:
        raise Refused(f"{shown}: entry '{name}' leads outside the environment folder")
    return parts


def _climbs_out(folder: list[str], target: str) -> bool:
    """Whether the relative symlink ``target``, in ``folder``, names a place above the root (by its text;
    links it passes through are resolved at the end)."""
    where = len(folder)
    for part in target.split("/"):
        if part == "..":
            where -= 1
            if where < 0:
                return True
        elif part not in ("", "."):
            where += 1
    return False


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "not a file, folder or link"


def unpack(archive: Path, dest: Path, shown: str, limits: Limits) -> None:
    """Unpack ``archive`` into the empty folder ``dest``; ``Refused`` (or ``tarfile.TarError``,
    ``OSError``, ``EOFError`` for an unreadable archive) otherwise. ``shown`` names it in messages."""
    size = archive.stat().st_size
    if size > limits.max_bytes:
        raise Refused(f"{shown} is {size} bytes, over the limit of {limits.max_bytes} bytes")
    root = confined.open_root(dest)
    try:
        with _decompressed(archive) as raw:
            stream = _Counted(raw, shown, limits.max_bytes)
            with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
                _Unpacker(tar, root, shown, limits).run()
    finally:
        os.close(root)


class _Unpacker:
    def __init__(self, tar: tarfile.TarFile, root: int, shown: str, limits: Limits) -> None:
        self.tar = tar
        self.root = root
        self.shown = shown
        self.limits = limits
        self.written = 0
        #: regular files made so far, by their path (what a hard link may name)
        self.files: set[str] = set()
        #: symlinks made, to resolve once all are there
        self.links: list[str] = []

    def run(self) -> None:
        count = 0
        for member in self.tar:
            count += 1
            if count > self.limits.max_entries:
                raise Refused(f"{self.shown} holds more than {self.limits.max_entries} entries")
            parts = _parts(member.name, self.shown)
            if not parts:  # the archive's own "./"
                continue
            try:
                if member.isdir():
                    os.close(confined.open_dir(self.root, "/".join(parts), create=True))
                elif member.isreg():
                    self._file(member, parts)
                elif member.issym():
                    self._symlink(member, parts)
                elif member.islnk():
                    self._hardlink(member, parts)
                else:
                    raise Refused(
                        f"{self.shown}: entry '{member.name}' is {_kind(member)}; an environment holds only files, "
                        "folders and links"
                    )
            except FileExistsError:
                raise Refused(f"{self.shown}: entry '{member.name}' appears twice") from None
            except confined.Refused as exc:  # a folder on its way is a symlink the archive made
                raise Refused(
                    f"{self.shown}: entry '{member.name}' lies beneath the symlink '{exc.at}'; entries are never "
                    "written through a link"
                ) from None
        for path in self.links:
            self._resolves_inside(path)

    def _new_file(self, member: tarfile.TarInfo, parts: list[str]) -> tuple[int, int]:
        """(folder, new file) descriptors for ``parts``; the file has the member's permission bits."""
        folder = (
            confined.open_dir(self.root, "/".join(parts[:-1]), create=True) if len(parts) > 1 else os.dup(self.root)
        )
        try:
            out = confined.create_new(folder, parts[-1], mode=0o600)
        except BaseException:
            os.close(folder)
            raise
        return folder, out

    def _copy(self, source: Any, out: int) -> None:
        while chunk := source.read(_CHUNK):
            self.written += len(chunk)
            if self.written > self.limits.max_bytes:
                raise Refused(f"{self.shown} unpacks to more than the limit of {self.limits.max_bytes} bytes")
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]

    def _finish(self, member: tarfile.TarInfo, out: int) -> None:
        os.fchmod(out, (member.mode & 0o755) | 0o600)  # no set-id or sticky bits, never group/other write
        try:
            os.utime(out, (member.mtime, member.mtime))
        except (OSError, OverflowError, ValueError):
            pass  # a time the file system cannot hold: the file stays, with now

    def _file(self, member: tarfile.TarInfo, parts: list[str]) -> None:
        if member.size > self.limits.max_bytes - self.written:
            raise Refused(f"{self.shown} unpacks to more than the limit of {self.limits.max_bytes} bytes")
        source = self.tar.extractfile(member)
        folder, out = self._new_file(member, parts)
        with confined.opened(folder), confined.opened(out):
            if source is not None:
                with source:
                    self._copy(source, out)
            self._finish(member, out)
        self.files.add("/".join(parts))

    def _hardlink(self, member: tarfile.TarInfo, parts: list[str]) -> None:
        name = member.linkname
        target = "/".join(p for p in name.split("/") if p not in ("", "."))
        if target not in self.files or name.startswith("/") or ".." in target.split("/"):
            raise Refused(
                f"{self.shown}: entry '{member.name}' is a hard link to '{name}', which is not a file earlier in the "
                "archive (a link must stay inside the environment folder)"
            )
        folder, out = self._new_file(member, parts)
        with confined.opened(folder), confined.opened(out):
            with os.fdopen(confined.open_file(self.root, target), "rb") as source:
                self._copy(source, out)
            self._finish(member, out)
        self.files.add("/".join(parts))

    def _symlink(self, member: tarfile.TarInfo, parts: list[str]) -> None:
        target = member.linkname
        interpreter = len(parts) in (2, 3) and parts[-2] == "bin" and _INTERPRETER.fullmatch(parts[-1]) is not None
        if not (interpreter and target.startswith("/")):
            if target.startswith("/") or "\0" in target or _climbs_out(parts[:-1], target):
                raise Refused(
                    f"{self.shown}: entry '{member.name}' is a symlink to '{target}', outside the environment "
                    "folder; symlinks must stay inside it"
                )
            if not interpreter:  # bin/python -> python3 -> /usr/bin/python3.11 leads out, as it should
                self.links.append("/".join(parts))
        folder = (
            confined.open_dir(self.root, "/".join(parts[:-1]), create=True) if len(parts) > 1 else os.dup(self.root)
        )
        with confined.opened(folder):
            os.symlink(target, parts[-1], dir_fd=folder)

    def _resolves_inside(self, path: str) -> None:
        """The symlink ``path`` leads inside the folder, through whatever other links it passes."""
        try:
            os.close(confined.open_beneath(self.root, path, follow=True))
        except confined.Refused as exc:
            if exc.kind in (confined.OUTSIDE, confined.DOTDOT):
                raise Refused(
                    f"{self.shown}: the symlink '{path}' leads outside the environment folder through other "
                    "symlinks; symlinks must stay inside it"
                ) from None
        except OSError:
            pass  # leads nowhere (a dangling link) or to something that cannot be opened: harmless
