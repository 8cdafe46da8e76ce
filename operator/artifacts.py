"""Getting a version's model file from the volume (size-limited, sha256-checked); downloads are in fetch.py.

Blocking I/O by design: the kopf handlers that call it are synchronous and run in kopf's thread pool,
so a multi-gigabyte copy never stalls the event loop. Every failure is an ``ArtifactError`` whose
``reason`` lands in the InferenceModel's conditions and whose message says what to fix.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 20 << 30


class ArtifactError(Exception):
    """A version's file cannot be had or used; ``reason`` is CamelCase, ``message`` says what to fix."""

    def __init__(self, reason: str, message: str, version: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.version = version


def _fsync_write(handle: object) -> None:
    handle.flush()  # type: ignore[attr-defined]
    os.fsync(handle.fileno())  # type: ignore[attr-defined]


def volume_file(root: Path, relative: str) -> Path:
    """The regular file ``relative`` names inside ``root`` (the namespace's folder on the volume).

    Refuses '..', absolute paths and symlinks anywhere on the way, and checks the resolved file is inside.
    """
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\0" in relative:
        raise ArtifactError(
            "PathRejected",
            f"source.path '{relative}' must be relative to this namespace's folder on the repository volume "
            f"('{root.name}/'), without '..'",
        )
    if root.is_symlink():
        raise ArtifactError("PathRejected", f"the namespace's folder '{root.name}' on the volume is a symlink")
    current = root
    for part in rel.parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            raise ArtifactError(
                "PathNotFound",
                f"source.path '{relative}' does not exist in this namespace's folder on the repository volume "
                f"('{root.name}/{relative}')",
            ) from None
        except OSError as exc:
            raise ArtifactError("PathRejected", f"source.path '{relative}' cannot be used: {exc.strerror}") from None
        if stat.S_ISLNK(mode):
            raise ArtifactError(
                "PathRejected",
                f"source.path '{relative}' passes through the symlink '{current.relative_to(root)}'; "
                "give the real path of the file",
            )
    if not stat.S_ISREG(mode):
        raise ArtifactError("PathRejected", f"source.path '{relative}' is not a regular file")
    resolved = current.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ArtifactError(
            "PathRejected", f"source.path '{relative}' is outside this namespace's folder on the volume"
        )
    return current


def copy_from_volume(
    root: Path,
    relative: str,
    sha256: str | None,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Copy a file already on the volume into the staging folder, checking sha256 when given."""
    src = volume_file(root, relative)
    digest = hashlib.sha256()
    size = 0
    with open(src, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as inp, open(dest, "wb") as out:
        while chunk := inp.read(CHUNK):
            if cancelled is not None and cancelled():
                raise ArtifactError("Cancelled", f"copy of source.path '{relative}' cancelled")
            size += len(chunk)
            if size > max_bytes:
                raise ArtifactError(
                    "TooLarge", f"source.path '{relative}' is larger than the limit of {max_bytes} bytes"
                )
            digest.update(chunk)
            out.write(chunk)
        _fsync_write(out)
    if sha256 and digest.hexdigest() != sha256.lower():
        raise ArtifactError(
            "ChecksumMismatch",
            f"source.path '{relative}' has sha256 {digest.hexdigest()} but source.sha256 is {sha256}",
        )
    return size
