"""One file from a store onto an open file: one stream, or parallel ranged GETs when one stream is slow.

The file starts as ONE ranged GET to its end, hashed as its bytes arrive (each chunk goes to the file,
``os.pwrite`` at its offset, and to the digest while it is still in the cache). ``_Probe`` judges that stream
``probe_seconds`` after its first byte. It stays alone when it is fast (``fast_stream``: more than one
connection to a remote object store gives; S3 says about 90 MB/s each) or when this thread was busy for most
of that time: the bytes then wait for this process, not for the store (a store in the cluster or on the node),
and parallel connections only add work: GIL hand-offs, a read back of every byte to hash it, the store's own
per-connection cost; on 2 shared cores that made the download 1.3 to 1.8 times slower
(``benchmarks/source_download.py``). Otherwise the store holds the connection to a fraction of the link (a
remote store): the stream ends where it got to, and the rest comes as parts of ``part_size`` bytes by
``parallel`` threads, hashed over the contiguous prefix as parts complete, read back from the page cache.
A stream or part whose connection breaks resumes from the last byte it wrote, after a backoff, until its
attempts or the deadline run out. Every byte counts against ``max_bytes`` and the caller's quota hook.
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
#: a first stream at least this fast (bytes per second) over its first PROBE_SECONDS is kept alone: more than
#: one connection to a remote object store gives (S3's guidance: about 90 MB/s each), so a near store
FAST_STREAM = 128 << 20
PROBE_SECONDS = 0.25
#: the share of the probe this thread must have been busy (on or waiting for a CPU) to stay alone when slow
BUSY_SHARE = 0.5


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
    #: how the first stream is judged (``_Probe``); ``parallel=1`` keeps it alone whatever it measures
    fast_stream: float = FAST_STREAM
    probe_seconds: float = PROBE_SECONDS
    busy_share: float = BUSY_SHARE
    cancelled: Callable[[], bool] | None = None
    on_bytes: Callable[[int], None] | None = None


def download(reader: RangeReader, file: RemoteFile, fd: int, limits: Limits, shown: str) -> str:
    """Fill the open, empty file ``fd`` with ``file``; the sha256 hex of what was written.

    ``file.sha256`` (when set) is checked; the caller checks sizes against listings beforehand, this
    refuses any byte past ``file.size`` or ``limits.max_bytes``."""
    if file.size > limits.max_bytes:
        raise SourceError(TOO_LARGE, f"{shown} is {file.size} bytes, over the limit of {limits.max_bytes} bytes")
    os.ftruncate(fd, file.size)
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

    def fetch_part(start: int, end: int, on_chunk: OnChunk | None = None) -> int:
        with deadline_scope(limits.deadline_at):
            return _fetch_part(reader, file, fd, start, end, limits, count, stop, shown, on_chunk)

    digest = hashlib.sha256()
    reached = 0
    if file.size:
        probe = _Probe(limits)

        def stream(chunk: memoryview, at: int) -> bool:
            digest.update(chunk)
            return probe.keeps(at)

        reached = fetch_part(0, file.size - 1, stream)
    if reached < file.size:  # the first stream was slow: the rest in parallel parts
        _parallel(fetch_part, reached, file.size, limits, stop, fd, digest)
    got = digest.hexdigest()
    if file.sha256 is not None and got != file.sha256.lower():
        raise SourceError(
            CHECKSUM_MISMATCH,
            f"{shown}: the bytes received do not match the sha256 that pins them ({file.pinned_by}); "
            "the file changed in the store, or the pin is wrong",
        )
    return got


#: sees each chunk of a stream once it is written, and where the bytes now end; False ends the stream there
OnChunk = Callable[[memoryview, int], bool]


class _Probe:
    """Whether the first stream stays alone: decided once, ``probe_seconds`` after its first byte.

    It stays when its bytes came at ``fast_stream`` or faster, or when this thread was busy (on a CPU, or
    waiting for one) for at least BUSY_SHARE of the time: then the bytes wait for this process, not for the
    store, and more connections would only add work. It is split when the thread mostly waited for the
    network: a remote store's connection is the limit, and parallel ones multiply it."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.first: tuple[float, int, float] | None = None  # (when, where, busy) as the first chunk ended
        self.decided = limits.parallel <= 1

    def keeps(self, at: int) -> bool:
        if self.decided:
            return True
        now = time.monotonic()
        if self.first is None:
            self.first = (now, at, busy_seconds())
            return True
        since, where, busy = self.first
        elapsed = now - since
        if elapsed < self.limits.probe_seconds:
            return True
        self.decided = True
        fast = (at - where) >= self.limits.fast_stream * elapsed
        return fast or busy_seconds() - busy >= self.limits.busy_share * elapsed


def busy_seconds() -> float:
    """This thread's time on a CPU plus its time runnable but waiting for one (Linux's schedstat), in seconds;
    its CPU time alone where the kernel keeps no schedstat."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stats:
            on_cpu, waiting = stats.read().split()[:2]
        return (int(on_cpu) + int(waiting)) / 1e9
    except (OSError, ValueError):
        return time.thread_time()


def _parallel(
    fetch_part: Callable[[int, int], int],
    start: int,
    size: int,
    limits: Limits,
    stop: threading.Event,
    fd: int,
    digest: Any,
) -> None:
    """Bytes ``start``..``size`` as parts, ``limits.parallel`` at once, hashed in order as the prefix completes."""
    parts = [(at, min(at + limits.part_size, size) - 1) for at in range(start, size, limits.part_size)]
    done = [False] * len(parts)
    hashed = 0  # parts hashed so far (a contiguous prefix)
    with concurrent.futures.ThreadPoolExecutor(max_workers=limits.parallel, thread_name_prefix="part") as pool:
        futures = {pool.submit(fetch_part, *part): i for i, part in enumerate(parts)}
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
                done[futures[future]] = True
                while hashed < len(parts) and done[hashed]:
                    first, last = parts[hashed]
                    _hash_span(fd, first, last + 1, digest)
                    hashed += 1
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise


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
    on_chunk: OnChunk | None = None,
) -> int:
    """Bytes ``start``..``end`` into ``fd`` at their offset; a break resumes where the bytes stopped. Where the
    bytes end: ``end + 1``, or less when ``on_chunk`` ended the stream early (or ``stop`` was set)."""
    at = start
    for attempt in range(limits.attempts):
        if stop.is_set() or at > end:  # stopped, or every byte came before the connection broke
            return at
        try:
            with reader.read_range(file, at, end) as answer:
                _check_range(answer, at, end, file.size, shown)
                for chunk in answer.chunks:
                    if at + len(chunk) > end + 1:
                        raise SourceError(TOO_LARGE, f"{shown}: the store sent more bytes than it listed")
                    count(len(chunk))
                    view = memoryview(chunk)
                    left = view
                    while left:
                        written = os.pwrite(fd, left, at)
                        left = left[written:]
                        at += written
                    if on_chunk is not None and not on_chunk(view, at) and answer.status == 206:
                        return at  # dropped with the rest unread (a store that sent 200 ignores ranges: read on)
                    if stop.is_set():
                        return at
            if at != end + 1:
                raise SourceError(UNAVAILABLE, f"{shown}: the store ended the answer early")
            return at
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
