"""A version's model folder delivered as one tar archive (a TensorFlow SavedModel: ``saved_model.pb``,
``variables/``, ``assets/``), unpacked beneath a descriptor by the operator's rules.

The archive may hold the folder's contents at its root (``tar -C model.savedmodel -czf model.tgz .``) or
in one top folder (``tar -czf model.tgz model.savedmodel``); plain, gzip, bzip2 and xz tars are read
(``tarfile`` tells them apart). Only regular files and folders are taken: an absolute name, a ``..``, a
link (symbolic or hard), a device or a FIFO refuses the whole archive, as does more than ``max_bytes``
unpacked or more than ``MAX_MEMBERS`` entries. Every folder and file is made with the confined
primitives (``mkdirat``/``O_EXCL|O_NOFOLLOW`` beneath the staged version folder), never by path.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable

from kubeinfer.server.repository import confined

from .artifacts import CHUNK, ArtifactError

MAX_MEMBERS = 100_000


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
) -> int:
    """Unpack the tar archive open as ``archive_fd`` into the empty folder ``dest_fd``; returns the bytes
    written. ``shown`` names the archive in messages (``version 1: source.uri '...'``)."""
    with os.fdopen(os.dup(archive_fd), "rb") as raw:
        raw.seek(0)
        try:
            with tarfile.open(fileobj=raw, mode="r:*") as tar:
                members = []
                for member in tar:
                    members.append(member)
                    if len(members) > MAX_MEMBERS:
                        raise ArtifactError("ArchiveRejected", f"{shown} holds more than {MAX_MEMBERS} entries")
                return _unpack(tar, members, dest_fd, shown, max_bytes, cancelled)
        except (tarfile.TarError, EOFError, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, tarfile.TarError) and exc.errno is not None:
                raise
            raise ArtifactError(
                "ArchiveRejected", f"{shown} is not a readable tar archive ({exc}); pack the model folder with tar"
            ) from None


def _unpack(
    tar: tarfile.TarFile,
    members: list[tarfile.TarInfo],
    dest_fd: int,
    shown: str,
    max_bytes: int,
    cancelled: Callable[[], bool] | None,
) -> int:
    entries = [(m, _name(m, shown)) for m in members]
    entries = [(m, p) for m, p in entries if p]  # the archive's own "./"
    for member, _ in entries:
        if not (member.isfile() or member.isdir()):
            raise ArtifactError(
                "ArchiveRejected",
                f"{shown}: entry '{member.name}' is {_kind(member)}; a model folder archive holds only files "
                "and folders",
            )
    tops = {p[0] for _, p in entries}
    # one top folder holding everything (``tar -czf m.tgz model.savedmodel``): its contents are the model folder
    strip = len(tops) == 1 and all(len(p) > 1 or m.isdir() for m, p in entries)
    written = 0
    for member, parts in entries:
        if strip:
            parts = parts[1:]
            if not parts:
                continue
        if cancelled is not None and cancelled():
            raise ArtifactError("Cancelled", f"unpacking {shown} cancelled")
        if member.isdir():
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
