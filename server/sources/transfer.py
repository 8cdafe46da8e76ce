"""One file from a store onto an open file: parallel ranged GETs, sha256 while streaming, resumed on a break.

A large object is fetched as parts of ``part_size`` bytes by ``parallel`` threads, each writing its bytes
at their offset (``os.pwrite``: no shared file position, no buffering of a whole part). The digest is
computed over the contiguous prefix as parts complete, read back from the page cache, so hashing overlaps
the download. A part whose connection breaks resumes from the last byte it wrote, after a backoff, until
its attempts or the deadline run out. Every byte counts against ``max_bytes`` and the caller's quota hook.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import CANCELLED, CHECKSUM_MISMATCH, TOO_LARGE, UNAVAILABLE, SourceError
from .guard import deadline_scope

PART_SIZE = 8 << 20
PARALLEL = 10
#: attempts per part (the first and the resumed ones) before the store counts as unavailable
ATTEMPTS = 12
HASH_READ = 4 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file a source names: where it goes, how big the store says it is, what pins its bytes."""

    #: relative path inside the version folder ("" for the single file of a one-object source)
    path: str
    size: int
    #: the sha256 the bytes must have (hex), when the store or the spec pins it
    sha256: str | None
    #: what pinned it, for the status ("sha256", "s3-checksum", "s3-version", "oci-digest")
    pinned_by: str
    #: the store's handle for it (an object key and version, a blob digest)
    locator: Any = None
    #: a tar layer to unpack (a modelcar image's), not a file to place
    unpack: bool = False


@dataclass(frozen=True)
class RangeAnswer:
    """A store's answer to a ranged GET, before its bytes: checked once, in ``_fetch_part``, for every store."""

    status: int
    #: the answer's Content-Range header ("" when it has none)
    content_range: str
    #: each chunk is valid only until the next is asked for (a reused buffer): written before the next
    chunks: Iterator[bytes | memoryview]


class RangeReader(Protocol):
    def read_range(self, file: RemoteFile, start: int, end: int) -> contextlib.AbstractContextManager[RangeAnswer]:
        """The answer for bytes ``start`` to ``end`` (inclusive) of ``file``; SourceError when the store refuses."""
        ...


@dataclass
class Limits:
    max_bytes: int
    deadline_at: float
    part_size: int = PART_SIZE
    parallel: int = PARALLEL
    attempts: int = ATTEMPTS
    cancelled: Callable[[], bool] | None = None
    on_bytes: Callable[[int], None] | None = None


def download(reader: RangeReader, file: RemoteFile, fd: int, limits: Limits, shown: str) -> str:
    """Fill the open, empty file ``fd`` with ``file``; the sha256 hex of what was written.

    ``file.sha256`` (when set) is checked; the caller checks sizes against listings beforehand, this
    refuses any byte past ``file.size`` or ``limits.max_bytes``."""
    if file.size > limits.max_bytes:
        raise SourceError(TOO_LARGE, f"{shown} is {file.size} bytes, over the limit of {limits.max_bytes} bytes")
    os.ftruncate(fd, file.size)
    parts = [(start, min(start + limits.part_size, file.size) - 1) for start in range(0, file.size, limits.part_size)]
    count_lock = threading.Lock()
    stop = threading.Event()

    def count(n: int) -> None:
        if limits.cancelled is not None and limits.cancelled():
            raise SourceError(CANCELLED, f"the download of {shown} was cancelled")
        if time.monotonic() > limits.deadline_at:
            raise SourceError(UNAVAILABLE, f"{shown}: the download did not finish within its deadline")
        if limits.on_bytes is not None:
            with count_lock:
                limits.on_bytes(n)

    def fetch_part(start: int, end: int) -> None:
        with deadline_scope(limits.deadline_at):
            _fetch_part(reader, file, fd, start, end, limits, count, stop, shown)

    digest = hashlib.sha256()
    if len(parts) <= 1:
        if parts:
            fetch_part(*parts[0])
        _hash_span(fd, 0, file.size, digest)
    else:
        done = [False] * len(parts)
        hashed = 0  # parts hashed so far (a contiguous prefix)
        with concurrent.futures.ThreadPoolExecutor(max_workers=limits.parallel, thread_name_prefix="part") as pool:
            futures = {pool.submit(fetch_part, *part): i for i, part in enumerate(parts)}
            try:
                for future in concurrent.futures.as_completed(futures):
                    future.result()
                    done[futures[future]] = True
                    while hashed < len(parts) and done[hashed]:
                        start, end = parts[hashed]
                        _hash_span(fd, start, end + 1, digest)
                        hashed += 1
            except BaseException:
                stop.set()
                for future in futures:
                    future.cancel()
                raise
    got = digest.hexdigest()
    if file.sha256 is not None and got != file.sha256.lower():
        raise SourceError(
            CHECKSUM_MISMATCH,
            f"{shown}: the bytes received do not match the sha256 that pins them ({file.pinned_by}); "
            "the file changed in the store, or the pin is wrong",
        )
    return got


def _fetch_part(
    reader: RangeReader,
    file: RemoteFile,
    fd: int,
    start: int,
    end: int,
    limits: Limits,
    count: Callable[[int], None],
    stop: threading.Event,
    shown: str,
) -> None:
    """Bytes ``start``..``end`` into ``fd`` at their offset; a break resumes where the bytes stopped."""
    at = start
    for attempt in range(limits.attempts):
        if stop.is_set() or at > end:  # stopped, or every byte came before the connection broke
            return
        try:
            with reader.read_range(file, at, end) as answer:
                _check_range(answer, at, end, file.size, shown)
                for chunk in answer.chunks:
                    if at + len(chunk) > end + 1:
                        raise SourceError(TOO_LARGE, f"{shown}: the store sent more bytes than it listed")
                    count(len(chunk))
                    view = memoryview(chunk)
                    while view:
                        written = os.pwrite(fd, view, at)
                        view = view[written:]
                        at += written
                    if stop.is_set():
                        return
            if at != end + 1:
                raise SourceError(UNAVAILABLE, f"{shown}: the store ended the answer early")
            return
        except SourceError as exc:
            if exc.reason != UNAVAILABLE or attempt + 1 == limits.attempts or time.monotonic() > limits.deadline_at:
                raise
            time.sleep(min(8.0, 0.25 * 2**attempt))
    raise SourceError(UNAVAILABLE, f"{shown}: the store broke off {limits.attempts} times")


def _check_range(answer: RangeAnswer, start: int, end: int, size: int, shown: str) -> None:
    """A 200 is the whole file (only right when the whole file was asked for); a 206 must start where asked."""
    if answer.status == 200 and not (start == 0 and end + 1 == size):
        raise SourceError(UNAVAILABLE, f"{shown}: the store ignored the byte range asked for")
    if answer.status == 206 and not answer.content_range.startswith(f"bytes {start}-"):
        raise SourceError(UNAVAILABLE, f"{shown}: the store answered another byte range")
    if answer.status not in (200, 206):
        raise SourceError(UNAVAILABLE, f"{shown}: the store answered a ranged read with HTTP {answer.status}")


def _hash_span(fd: int, start: int, end: int, digest: Any) -> None:
    at = start
    while at < end:
        block = os.pread(fd, min(HASH_READ, end - at), at)
        if not block:
            raise SourceError(UNAVAILABLE, "the staged file is shorter than the bytes written to it")
        digest.update(block)
        at += len(block)
