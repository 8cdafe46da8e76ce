"""POSIX shared-memory regions (``shm_open`` + ``mmap``), as Triton's ``shared_memory_manager.cc`` maps them.

``shm_open(key)`` on Linux is ``open("/dev/shm/<key without leading '/'>", O_NOFOLLOW | O_CLOEXEC)``
(glibc), so that is what this does, after refusing names that are not a single path component. The
whole object is mapped once at registration; tensors are views into it (zero copy). Unregistering
drops the mapping; views still held by a request in flight keep the memory mapped until they are
released (Triton defers the unmap the same way: ``awaiting_unregister_``).
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass

from ..vocabulary.errors import InvalidArgument

SHM_DIR = "/dev/shm"
NAME_MAX = 255


@dataclass
class SystemRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap
    #: the registered window [offset, offset + byte_size) of the mapping
    view: memoryview

    def status(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _path(name: str, key: str) -> str:
    bare = key.lstrip("/")
    if not bare or "/" in bare or bare in (".", "..") or len(bare.encode()) > NAME_MAX or "\0" in bare:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': invalid key '{key}': a POSIX shared-memory "
            "name is '/' followed by up to 255 characters without '/'"
        )
    return os.path.join(SHM_DIR, bare)


def open_region(name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
    """Map ``byte_size`` bytes at ``offset`` of the POSIX shared-memory object ``key``; Triton's errors."""
    path = _path(name, key)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise InvalidArgument(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgument(f"Invalid shared memory region: '{key}'")
        if byte_size == 0 or offset + byte_size > info.st_size:
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        try:
            mapping = mmap.mmap(fd, offset + byte_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"failed to register shared memory region '{name}': {exc}") from None
    finally:
        os.close(fd)  # the mapping outlives the descriptor, as in Triton
    view = memoryview(mapping)[offset : offset + byte_size]
    return SystemRegion(name, key, offset, byte_size, mapping, view)
