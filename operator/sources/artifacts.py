"""Getting a version's model file from the volume (size-limited, sha256-checked); downloads are in fetch.py.

Blocking I/O by design: the kopf handlers that call it are synchronous and run in kopf's thread pool,
so a multi-gigabyte copy never stalls the event loop. Every failure is an ``ArtifactError`` whose
``reason`` lands in the InferenceModel's conditions and whose message says what to fix.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from kubeinfer.server.repository import confined

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 20 << 30


class ArtifactError(Exception):
    """A version's file cannot be had or used; ``reason`` is CamelCase, ``message`` says what to fix."""

    def __init__(self, reason: str, message: str, version: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.version = version


def volume_file(root_fd: int, relative: str, namespace: str) -> int:
    """The regular file ``relative`` names inside the namespace's folder ``root_fd``, opened for reading.

    Refuses '..', absolute paths and symlinks anywhere on the way: the file is reached by the confined
    walk (``kubeinfer.server.repository.confined``) one component at a time with ``O_NOFOLLOW``, so a
    component swapped for a symlink while the copy starts is refused, never followed.
    """
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\0" in relative:
        raise ArtifactError(
            "PathRejected",
            f"source.path '{relative}' must be relative to this namespace's folder on the repository volume "
            f"('{namespace}/'), without '..'",
        )
    try:
        return confined.open_file(root_fd, relative)
    except confined.Refused as exc:
        raise ArtifactError(
            "PathRejected",
            f"source.path '{relative}' passes through the symlink '{exc.at}'; give the real path of the file",
        ) from None
    except FileNotFoundError:
        raise ArtifactError(
            "PathNotFound",
            f"source.path '{relative}' does not exist in this namespace's folder on the repository volume "
            f"('{namespace}/{relative}')",
        ) from None
    except (IsADirectoryError, NotADirectoryError):
        raise ArtifactError("PathRejected", f"source.path '{relative}' is not a regular file") from None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ArtifactError("PathRejected", f"source.path '{relative}' is not a regular file") from None
        raise ArtifactError("PathRejected", f"source.path '{relative}' cannot be used: {exc.strerror}") from None


class Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def copy_chunks(
    chunks: Iterable[bytes],
    write: Callable[[bytes], object],
    digest: Digest,
    *,
    copy: str,
    source: str,
    max_bytes: int,
    cancelled: Callable[[], bool] | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> int:
    """Writes every chunk and hashes it into ``digest``; returns the bytes copied. The one copy loop of a
    model file, from the volume or a download: ``Cancelled`` ("<copy> cancelled") as soon as ``cancelled()``
    says so, ``TooLarge`` ("<source> is larger than ...") once more than ``max_bytes`` came; ``on_chunk`` sees
    each chunk's size before it is written (the download's deadline, the namespace quota) and may raise."""
    size = 0
    for chunk in chunks:
        if cancelled is not None and cancelled():
            raise ArtifactError("Cancelled", f"{copy} cancelled")
        size += len(chunk)
        if size > max_bytes:
            raise ArtifactError("TooLarge", f"{source} is larger than the operator's limit of {max_bytes} bytes")
        if on_chunk is not None:
            on_chunk(len(chunk))
        digest.update(chunk)
        write(chunk)
    return size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def copy_from_volume(
    root_fd: int,
    relative: str,
    sha256: str | None,
    dest_fd: int,
    *,
    namespace: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Copy a file of the namespace's folder ``root_fd`` into the open staged file ``dest_fd``, checking
    sha256 when given; ``dest_fd`` is written from its start and fsynced, and stays open."""
    digest = hashlib.sha256()
    with confined.opened(volume_file(root_fd, relative, namespace)) as src:
        if os.fstat(src).st_size > max_bytes:  # told by its size: a sparse file of any size costs its writer nothing
            raise ArtifactError(
                "TooLarge", f"source.path '{relative}' is larger than the operator's limit of {max_bytes} bytes"
            )
        size = copy_chunks(
            iter(lambda: os.read(src, CHUNK), b""),
            lambda chunk: _write_all(dest_fd, chunk),
            digest,
            copy=f"copy of source.path '{relative}'",
            source=f"source.path '{relative}'",
            max_bytes=max_bytes,
            cancelled=cancelled,
        )
        os.fsync(dest_fd)
    if sha256 and digest.hexdigest() != sha256.lower():
        raise ArtifactError(
            "ChecksumMismatch",
            f"source.path '{relative}' has sha256 {digest.hexdigest()} but source.sha256 is {sha256}",
        )
    return size
