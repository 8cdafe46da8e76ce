"""What a stub and the server exchange: small JSON messages on a Unix socket, tensors in shared memory.

Messages are length-prefixed JSON objects (``op`` names the message). JSON, not pickle: the server
reads what a model's process writes, and reading must never run code.

Tensors never travel in a message. Each side owns an ``Arena`` of shared-memory segments it allocates
from: the server writes request tensors into its arena, the stub writes response tensors into its own.
A message carries a tensor's descriptor ``[name, dtype, shape, segment, offset, nbytes]`` and the other
side reads it in place (``SegmentMap.array``): one copy each way, into the arena and never out of it.
A block goes back to its owner's free list when the reader's last view of it is gone (a ``free``
message, sent after a weak reference to the view fires).

Segments are files in ``/dev/shm`` (so the pod's ``/dev/shm`` size bounds them, as Triton's), unlinked as
soon as they are created: they have no name another process could open, nothing is left behind when a
process dies, and the file descriptor reaches the other side over the socket (``SCM_RIGHTS``). Blocks
are reserved with ``posix_fallocate``, so a full ``/dev/shm`` is an error for one request, never a
SIGBUS.

The server maps no segment at all. A stub runs a model's code, which holds the descriptors of both
sides' segments and may truncate one; touching a mapping past the shortened file's end is a SIGBUS that
would end the server and every model in it. So the server's arena is written with ``pwrite``
(``Arena(mapped=False)``: a truncated file grows again, never faults) and the stub's segments are read
with ``pread`` into a copy (``SegmentReader``: a short read is an error for that tensor), as client shared
memory is (``server/sharedmemory/system.py``). The stub, which trusts the server, maps both and reads
the server's tensors in place (``SegmentMap``).

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import mmap
import os
import secrets
import socket
import stat
import struct
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

_HEADER = struct.Struct("<I")
#: a message's size limit (tensors go through shared memory; this bounds texts and parameters)
MAX_MESSAGE = 64 << 20
_ALIGN = 64
#: an extra segment that has been wholly free this long is given back
IDLE_SEGMENT_SECONDS = 5.0
#: fds one recvmsg call accepts
_MAX_FDS = 16


class ShmError(Exception):
    """Shared memory could not be had (a full ``/dev/shm``): fails the request that needed it."""


class SegmentUnreadable(ValueError):
    """A tensor the stub named cannot be read from its segment: the stub's process truncated the file."""


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


# ---- framing ----------------------------------------------------------------------------------------
def frame(message: dict[str, Any], dumps: Callable[[Any], bytes] | None = None) -> bytes:
    body = dumps(message) if dumps is not None else json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


class Decoder:
    """Splits a byte stream into messages."""

    def __init__(self, loads: Callable[[bytes], Any] = json.loads) -> None:
        self._buffer = bytearray()
        self._loads = loads

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        while len(self._buffer) >= 4:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > MAX_MESSAGE:
                raise ValueError(f"message of {size} bytes is over the {MAX_MESSAGE} byte limit")
            if len(self._buffer) < 4 + size:
                break
            body = bytes(self._buffer[4 : 4 + size])
            del self._buffer[: 4 + size]
            message = self._loads(body)
            if not isinstance(message, dict):
                raise ValueError("a message must be a JSON object")
            messages.append(message)
        return messages


def recv(sock: socket.socket, fds: list[int], size: int = 1 << 16) -> bytes:
    """Read what is there (blocking or not, as the socket is); file descriptors that came with it are
    appended to ``fds``. b"" at end of stream."""
    data, ancillary, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(_MAX_FDS * 4))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    return data


# ---- segments -----------------------------------------------------------------------------------
def _no_room(size: int, exc: OSError) -> ShmError:
    return ShmError(
        f"cannot reserve {size} bytes of shared memory in {shm_dir()} ({exc.strerror}): the Python model's "
        "tensors do not fit; give the server a larger /dev/shm (InferenceServer spec.sharedMemorySize)"
    )


def create_segment(size: int, mapped: bool = True) -> tuple[int, mmap.mmap | None]:
    """A new shared-memory file of ``size`` bytes, reserved, unlinked, and mapped unless not ``mapped``."""
    path = os.path.join(shm_dir(), f"kubeinfer-{os.getpid()}-{secrets.token_hex(8)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.unlink(path)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            raise _no_room(size, exc) from None
        return fd, mmap.mmap(fd, size) if mapped else None
    except BaseException:
        os.close(fd)
        raise


class Segment:
    __slots__ = ("fd", "size", "map", "free", "used", "idle_since")

    def __init__(self, fd: int, size: int, mapping: mmap.mmap | None) -> None:
        self.fd = fd
        self.size = size
        self.map = mapping
        #: free ranges (offset, size), sorted by offset
        self.free: list[tuple[int, int]] = [(0, size)]
        #: allocated blocks: offset → size
        self.used: dict[int, int] = {}
        self.idle_since = time.monotonic()

    def alloc(self, nbytes: int) -> int | None:
        for i, (offset, size) in enumerate(self.free):
            if size >= nbytes:
                if size == nbytes:
                    del self.free[i]
                else:
                    self.free[i] = (offset + nbytes, size - nbytes)
                self.used[offset] = nbytes
                return offset
        return None

    def release(self, offset: int) -> bool:
        nbytes = self.used.pop(offset, None)
        if nbytes is None:
            return False  # not a block of ours (a confused or hostile peer): ignored
        i = bisect.bisect(self.free, (offset, 0))
        if i < len(self.free) and offset + nbytes == self.free[i][0]:
            nbytes += self.free[i][1]
            del self.free[i]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == offset:
            offset, nbytes = self.free[i - 1][0], self.free[i - 1][1] + nbytes
            del self.free[i - 1]
            i -= 1
        self.free.insert(i, (offset, nbytes))
        if not self.used:
            self.idle_since = time.monotonic()
        return True

    def write(self, offset: int, data: np.ndarray | bytes) -> None:
        """``data`` at ``offset``: copied into the mapping, or with ``pwrite`` where there is none."""
        if self.map is not None:
            if isinstance(data, bytes):
                self.map[offset : offset + len(data)] = data
            else:
                np.copyto(np.ndarray(data.shape, data.dtype, buffer=self.map, offset=offset), data, casting="no")
            return
        raw = (
            memoryview(data) if isinstance(data, bytes) else np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
        )
        done = 0
        try:
            while done < len(raw):  # one call writes at most ~2 GiB on Linux
                done += os.pwrite(self.fd, raw[done:], offset + done)
        except OSError as exc:  # the stub truncated the file and /dev/shm has no room to grow it back
            raise _no_room(len(raw), exc) from None

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # views of it are still alive: the mapping goes with the last of them
                pass
        os.close(self.fd)


class Arena:
    """The shared memory one side writes its tensors to. Not thread-safe: callers serialise.

    ``announce(segment_id, fd, size)`` tells the other side about a new segment; ``retire(segment_id)``
    that one is gone. ``mapped=False`` (the server's): segments are written with ``pwrite``, never mapped.
    """

    def __init__(
        self,
        initial: int,
        announce: Callable[[int, int, int], None],
        retire: Callable[[int], None],
        mapped: bool = True,
    ) -> None:
        self.initial = initial
        self.announce = announce
        self.retire = retire
        self.mapped = mapped
        self.segments: dict[int, Segment] = {}
        self._next = 0

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """(segment, offset) of a new block of at least ``nbytes``; raises ShmError."""
        nbytes = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        for sid, segment in self.segments.items():
            offset = segment.alloc(nbytes)
            if offset is not None:
                return sid, offset
        self._trim()
        size = max(self.initial, nbytes) if not self.segments else max(nbytes, self._largest(), self.initial)
        size = -(-size // (1 << 20)) * (1 << 20)
        fd, mapping = create_segment(size, self.mapped)
        sid = self._next
        self._next += 1
        segment = self.segments[sid] = Segment(fd, size, mapping)
        self.announce(sid, fd, size)
        offset = segment.alloc(nbytes)
        assert offset is not None
        return sid, offset

    def _largest(self) -> int:
        return max((s.size for s in self.segments.values()), default=0)

    def free(self, sid: int, offset: int) -> None:
        segment = self.segments.get(sid)
        if segment is not None and segment.release(offset):
            self._trim()

    def _trim(self) -> None:
        """Give back extra segments that have been wholly free for a while (the first one stays)."""
        if len(self.segments) < 2:
            return
        now = time.monotonic()
        first = min(self.segments, default=None)
        for sid, segment in list(self.segments.items()):
            if sid != first and not segment.used and now - segment.idle_since > IDLE_SEGMENT_SECONDS:
                del self.segments[sid]
                self.retire(sid)
                segment.close()

    def in_use(self) -> int:
        return sum(sum(s.used.values()) for s in self.segments.values())

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


def _checked(
    desc: list[Any], segment_size: Callable[[int], int | None]
) -> tuple[str, str, tuple[int, ...], int, int, int]:
    """A descriptor's fields, checked against what the other side may name: whole numbers, no negative
    dimension, a data type without objects, a block inside one of its own segments (``segment_size``
    answers None for an unknown one) and as many bytes as the type and shape need. ValueError otherwise."""
    name, dtype_text, shape, sid, offset, nbytes = desc
    shape = tuple(int(d) for d in shape)
    if not all(type(v) is int for v in (sid, offset, nbytes)):
        raise ValueError(f"tensor '{name}': segment, offset and size must be whole numbers")
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor '{name}': negative dimension in {list(shape)}")
    if dtype_text != "O":
        dtype = _dtype(dtype_text)
        if sid >= 0 and math.prod(shape) * dtype.itemsize != nbytes:
            raise ValueError(f"tensor '{name}': {nbytes} bytes do not hold {dtype} {list(shape)}")
    if sid >= 0:
        size = segment_size(sid)
        if size is None:
            raise ValueError(f"tensor '{name}': unknown shared-memory segment {sid}")
        if not (0 <= offset and 0 <= nbytes and offset + nbytes <= size):
            raise ValueError(f"tensor '{name}': block [{offset}, {offset + nbytes}) outside segment {sid}")
    return str(name), str(dtype_text), shape, sid, offset, nbytes


def _empty(shape: tuple[int, ...], dtype_text: str) -> np.ndarray:
    """A tensor without elements: it has no block."""
    return np.empty(shape, np.object_ if dtype_text == "O" else _dtype(dtype_text))


class SegmentMap:
    """The other side's segments, mapped here, and the views of its blocks handed out (the stub's: it
    reads the server's tensors in place).

    ``release(segment, offset)`` is called (from whichever thread drops the last view) once a block is
    no longer read here; the caller turns it into a ``free`` message.
    """

    def __init__(self, release: Callable[[int, int], None]) -> None:
        self.maps: dict[int, tuple[int, mmap.mmap]] = {}
        self.release = release
        #: a weak reference per view handed out, with the block it reads (``weakref.finalize`` costs far more)
        self._views: dict[int, tuple[weakref.ref[np.ndarray], int, int]] = {}

    def add(self, sid: int, fd: int, size: int) -> None:
        try:
            self.maps[sid] = (size, mmap.mmap(fd, size))
        finally:
            os.close(fd)

    def drop(self, sid: int) -> None:
        entry = self.maps.pop(sid, None)
        if entry is not None:
            try:
                entry[1].close()
            except BufferError:
                pass

    def _size(self, sid: int) -> int | None:
        entry = self.maps.get(sid)
        return entry[0] if entry is not None else None

    def array(self, desc: list[Any]) -> np.ndarray:
        """The tensor ``desc`` describes, read in place (BYTES: decoded, and the block freed at once)."""
        _, dtype_text, shape, sid, offset, nbytes = _checked(desc, self._size)
        if sid < 0:
            return _empty(shape, dtype_text)
        mapping = self.maps[sid][1]
        if dtype_text == "O":
            try:
                return decode_bytes(memoryview(mapping)[offset : offset + nbytes], shape)
            finally:
                self.release(sid, offset)
        array: np.ndarray = np.ndarray(shape, _dtype(dtype_text), buffer=mapping, offset=offset)
        ref = weakref.ref(array, self._gone)
        self._views[id(ref)] = (ref, sid, offset)
        return array

    def _gone(self, ref: weakref.ref[np.ndarray]) -> None:
        entry = self._views.pop(id(ref), None)
        if entry is not None:
            self.release(entry[1], entry[2])

    def close(self) -> None:
        for sid in list(self.maps):
            self.drop(sid)


class SegmentReader:
    """The stub's segments as the server reads them: copied out with ``pread``, never mapped.

    The stub's model code holds these descriptors and may truncate a file after naming a block in it. A
    mapping would then fault (SIGBUS, the server's end) at the first byte past the new end; ``pread``
    returns fewer bytes instead, and that one tensor is an error (``SegmentUnreadable``). The price is one
    copy per tensor the server takes from a stub (outputs, BLS inputs); in return the block goes back to
    the stub at once (``release``), not when the server's last view of it dies. Not thread-safe: the
    server calls it on its loop.
    """

    def __init__(self, release: Callable[[int, int], None]) -> None:
        #: segment → (size announced, descriptor)
        self.fds: dict[int, tuple[int, int]] = {}
        self.release = release

    def add(self, sid: int, fd: int, size: int) -> None:
        """Take the descriptor that came with a ``seg`` message (closed on ``drop``); ValueError unless it
        is a file (its size is checked by every read: the stub may shorten it at any time)."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or size < 0:
                raise ValueError(f"shared-memory segment {sid} is not a file")
        except BaseException:
            os.close(fd)
            raise
        self.drop(sid)
        self.fds[sid] = (size, fd)

    def drop(self, sid: int) -> None:
        entry = self.fds.pop(sid, None)
        if entry is not None:
            os.close(entry[1])

    def _size(self, sid: int) -> int | None:
        entry = self.fds.get(sid)
        return entry[0] if entry is not None else None

    def array(self, desc: list[Any]) -> np.ndarray:
        """A copy of the tensor ``desc`` describes (read-only, as a request's inputs are)."""
        name, dtype_text, shape, sid, offset, nbytes = _checked(desc, self._size)
        if sid < 0:
            return _empty(shape, dtype_text)
        try:
            data = self._read(name, sid, offset, nbytes)
        finally:
            self.release(sid, offset)
        if dtype_text == "O":
            return decode_bytes(memoryview(data), shape)
        return np.frombuffer(data, _dtype(dtype_text)).reshape(shape)

    def _read(self, name: str, sid: int, offset: int, nbytes: int) -> bytes:
        fd = self.fds[sid][1]
        data = os.pread(fd, nbytes, offset)
        if len(data) == nbytes:
            return data
        parts, done = [data], len(data)  # over ~2 GiB (one call's most on Linux), or the file is shorter
        while done < nbytes:
            part = os.pread(fd, nbytes - done, offset + done)
            if not part:
                raise SegmentUnreadable(
                    f"tensor '{name}' is at bytes [{offset}, {offset + nbytes}) of the stub's shared-memory segment "
                    f"{sid}, which the stub's process truncated to {os.fstat(fd).st_size} bytes"
                )
            parts.append(part)
            done += len(part)
        return b"".join(parts)

    def close(self) -> None:
        for sid in list(self.fds):
            self.drop(sid)


@functools.lru_cache(maxsize=64)
def _dtype(text: str) -> np.dtype[Any]:
    dtype = np.dtype(text)
    if dtype.hasobject or dtype.fields is not None or dtype.shape != ():
        raise ValueError(f"unsupported tensor data type {text!r}")
    return dtype


# ---- tensors ------------------------------------------------------------------------------------
def encode_bytes(array: np.ndarray) -> bytes:
    """BYTES elements as 4-byte little-endian lengths, each followed by its bytes (Triton's layout)."""
    parts = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else bytes(item) if isinstance(item, np.bytes_) else str(item).encode()
        parts += [_HEADER.pack(len(data)), data]
    return b"".join(parts)


def decode_bytes(buffer: memoryview, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    values: list[bytes] = []
    offset = 0
    end = len(buffer)
    for _ in range(count):
        if offset + 4 > end:
            raise ValueError("BYTES tensor shorter than its shape")
        (length,) = _HEADER.unpack_from(buffer, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element runs past the tensor's end")
        values.append(bytes(buffer[offset : offset + length]))
        offset += length
    out = np.empty(count, dtype=np.object_)
    out[:] = values
    return out.reshape(shape)


def write_tensor(arena: Arena, name: str, array: np.ndarray) -> list[Any]:
    """Copy ``array`` into a new block of ``arena``; its descriptor."""
    if array.dtype.kind in ("O", "U", "S"):
        data = encode_bytes(array)
        shape = list(array.shape)
        if not data:
            return [name, "O", shape, -1, 0, 0]
        sid, offset = arena.alloc(len(data))
        _write(arena, sid, offset, data)
        return [name, "O", shape, sid, offset, len(data)]
    if array.nbytes == 0:
        return [name, array.dtype.str, list(array.shape), -1, 0, 0]
    sid, offset = arena.alloc(array.nbytes)
    _write(arena, sid, offset, array)
    return [name, array.dtype.str, list(array.shape), sid, offset, array.nbytes]


def _write(arena: Arena, sid: int, offset: int, data: np.ndarray | bytes) -> None:
    """Into the block just allocated; a failure gives it back (it has no descriptor yet)."""
    try:
        arena.segments[sid].write(offset, data)
    except BaseException:
        arena.free(sid, offset)
        raise


def write_tensors(arena: Arena, tensors: Iterable[tuple[str, np.ndarray]]) -> list[list[Any]]:
    """Descriptors of ``tensors``; on failure, what was written so far is freed again."""
    descs: list[list[Any]] = []
    try:
        for name, array in tensors:
            descs.append(write_tensor(arena, name, np.asarray(array)))
    except BaseException:
        free_descs(arena, descs)
        raise
    return descs


def free_descs(arena: Arena, descs: Iterable[list[Any]]) -> None:
    for desc in descs:
        if desc[3] >= 0:
            arena.free(desc[3], desc[4])
