"""POSIX shared-memory regions (``shm_open``), read and written through the file descriptor.

``shm_open(key)`` on Linux is ``open("/dev/shm/<key without leading '/'>", O_NOFOLLOW | O_CLOEXEC)``
(glibc), so that is what this does, after refusing names that are not a single path component.

Triton maps the object and hands tensors out as pointers into the mapping. That lets the client take the
server down: a client that truncates its file after registering it turns every later access of the mapping
into SIGBUS (the process dies, every tenant's requests with it). So this keeps no mapping: the region holds
the descriptor, an input is copied out with ``pread`` and an output written with ``pwrite``. A system call
on a file that became shorter returns fewer bytes (or extends it) instead of faulting, so a truncated region
is a 400 for that request, and the server goes on serving (a short read, or ``fstat`` before a write,
says so). The cost is one copy per input where the mapping gave a view
(benchmarks/shm_access.py, docs/api/shared-memory.md).
"""

from __future__ import annotations

import os
import stat
import weakref
from dataclasses import dataclass, field

from ..config import MAX_FILE_NAME_BYTES
from ..vocabulary.errors import InvalidArgument

SHM_DIR = "/dev/shm"
#: longest POSIX shared-memory name after its '/': a file name under /dev/shm
NAME_MAX = MAX_FILE_NAME_BYTES


@dataclass
class SystemRegion:
    name: str
    key: str
    offset: int
    byte_size: int
    #: the open object (O_RDWR); closed when the region is dropped (unregistered), never while in use
    fd: int
    _closer: weakref.finalize[[int], SystemRegion] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # closed by reference counting once nothing holds the region, so a descriptor number is never
        # closed (and reused by another file) while a read or write still has it
        self._closer = weakref.finalize(self, os.close, self.fd)

    def status(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def _check_size(self, start: int, size: int) -> None:
        """Refuse an access the file no longer holds (the client truncated it after registering)."""
        end = self.offset + start + size
        actual = os.fstat(self.fd).st_size
        if actual < end:
            raise InvalidArgument(
                f"shared memory region '{self.name}' (key '{self.key}') is {actual} bytes long but the request "
                f"uses its bytes up to {end}: the object was truncated after it was registered; unregister "
                "and register it again"
            )

    def read(self, start: int, size: int) -> bytes:
        """``size`` bytes at ``start`` of the registered window, copied out (never a view of the object).

        ``os.pread`` into a new bytes object: much faster for large reads than ``preadv`` into ``np.empty``
        (numpy asks for transparent huge pages on large arrays; the first touch paid for them).
        """
        position = self.offset + start
        data = os.pread(self.fd, size, position)  # short (never a fault) when the object was truncated
        if len(data) == size:
            return data
        parts = [data]  # over 2 GiB (one call's most on Linux), or truncated between the fstat and the read
        done = len(data)
        while done < size:
            part = os.pread(self.fd, size - done, position + done)
            if not part:
                self._check_size(start, size)
                raise InvalidArgument(f"shared memory region '{self.name}' (key '{self.key}') was truncated")
            parts.append(part)
            done += len(part)
        return b"".join(parts)

    def write(self, start: int, data: bytes | memoryview) -> None:
        """``data`` into the registered window at ``start``; a file truncated meanwhile grows, never faults."""
        size = len(data)
        self._check_size(start, size)
        view = memoryview(data).cast("B")
        done = 0
        while done < size:
            done += os.pwrite(self.fd, view[done:], self.offset + start + done)

    def close(self) -> None:
        self._closer()


def _path(name: str, key: str) -> str:
    bare = key.lstrip("/")
    if not bare or "/" in bare or bare in (".", "..") or len(bare.encode()) > NAME_MAX or "\0" in bare:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': invalid key '{key}': a POSIX shared-memory "
            f"name is '/' followed by up to {NAME_MAX} characters without '/'"
        )
    return os.path.join(SHM_DIR, bare)


def open_region(name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
    """Open the POSIX shared-memory object ``key`` for ``byte_size`` bytes at ``offset``; Triton's errors."""
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
    except BaseException:
        os.close(fd)
        raise
    return SystemRegion(name, key, offset, byte_size, fd)
