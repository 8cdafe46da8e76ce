"""The downloader (``transfer.download``) against a real ranged HTTP server, through the stores' real client.

A near store (this process's loopback, served as fast as it is read) is read as ONE stream, hashed as it
arrives; a store that holds each connection to a slow rate while this thread waits for it (what a remote object
store does) has its rest split into parallel ranged parts after the probe. Either way the bytes and the digest
are right, a wrong pin is refused, and a connection cut mid-body resumes from the byte it reached.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
from kubeinfer.server.sources.errors import CHECKSUM_MISMATCH, SourceError
from kubeinfer.server.sources.transfer import Limits, RangeAnswer, RemoteFile, download

DATA = os.urandom(6 << 20)
_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


class RangedStore:
    """A threaded HTTP server of ``DATA`` by byte range, at most ``rate`` bytes per second per connection
    (0: as fast as it is read); ``cut_first_at`` ends the first answer's connection after that many bytes;
    ``whole``: every answer is a 200 of the whole file, whatever range was asked (a store that ignores ranges)."""

    def __init__(self, rate: int = 0, cut_first_at: int | None = None, whole: bool = False) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.active = 0
        self.most_at_once = 0
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                found = _RANGE.fullmatch(self.headers.get("Range", ""))
                assert found, self.headers
                start, end = int(found[1]), int(found[2])
                with lock:
                    outer.ranges.append((start, end))
                    cut = cut_first_at if len(outer.ranges) == 1 else None
                    outer.active += 1
                    outer.most_at_once = max(outer.most_at_once, outer.active)
                if whole:
                    start, end = 0, len(DATA) - 1
                try:
                    self.send_response(200 if whole else 206)
                    if not whole:
                        self.send_header("Content-Range", f"bytes {start}-{end}/{len(DATA)}")
                    self.send_header("Content-Length", str(end + 1 - start))
                    self.end_headers()
                    at = start
                    while at <= end:
                        step = min(64 << 10, end + 1 - at)
                        if cut is not None and at + step > start + cut:
                            self.wfile.write(DATA[at : start + cut])
                            self.close_connection = True
                            return
                        self.wfile.write(DATA[at : at + step])
                        at += step
                        if rate:
                            time.sleep(step / rate)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the downloader ended this stream to split the rest
                finally:
                    with lock:
                        outer.active -= 1

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/blob"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Reader:
    """A store's ``read_range`` as S3 and OCI have it: a ``direct`` GET through the guarded client."""

    def __init__(self, url: str) -> None:
        self.url = httpx.URL(url)
        self.client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.0/8"])))

    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        headers = {"Range": f"bytes={start}-{end}"}
        with self.client.request("GET", self.url, headers, namespace="ns", where="blob", direct=True) as answer:
            yield answer.ranged()


@pytest.fixture
def out(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    yield fd
    os.close(fd)


def _file(sha256: str | None = None) -> RemoteFile:
    return RemoteFile("", len(DATA), sha256 or hashlib.sha256(DATA).hexdigest(), "sha256")


def _limits(**kw: Any) -> Limits:
    return Limits(
        **({"max_bytes": 1 << 30, "deadline_at": time.monotonic() + 60, "part_size": 512 << 10, "parallel": 8} | kw)
    )


def _written(fd: int) -> bytes:
    return os.pread(fd, len(DATA) + 1, 0)


def test_a_near_store_is_read_as_one_stream(out: int) -> None:
    store = RangedStore()
    try:
        got = download(Reader(store.url), _file(), out, _limits(), "blob")
    finally:
        store.close()
    assert got == hashlib.sha256(DATA).hexdigest()
    assert _written(out) == DATA
    assert store.ranges == [(0, len(DATA) - 1)]


def test_a_slow_connection_has_the_rest_split_into_parallel_parts(out: int) -> None:
    store = RangedStore(rate=4 << 20)  # 4 MiB/s per connection: the whole file alone would take 1.5 s
    try:
        got = download(Reader(store.url), _file(), out, _limits(probe_seconds=0.2), "blob")
    finally:
        store.close()
    assert got == hashlib.sha256(DATA).hexdigest()
    assert _written(out) == DATA
    first, *parts = store.ranges
    assert first == (0, len(DATA) - 1) and len(parts) > 1, store.ranges
    # the stream ended where it got to, and the parts cover the rest exactly, each once
    ordered = sorted(parts)
    assert 0 < ordered[0][0] < len(DATA) // 2 and ordered[-1][1] == len(DATA) - 1, ordered
    assert all(a[1] + 1 == b[0] for a, b in zip(ordered, ordered[1:], strict=False))
    assert store.most_at_once > 2, store.most_at_once


def test_one_connection_is_kept_however_slow_when_parallel_is_one(out: int) -> None:
    store = RangedStore(rate=16 << 20)
    try:
        download(Reader(store.url), _file(), out, _limits(probe_seconds=0.05, parallel=1), "blob")
    finally:
        store.close()
    assert _written(out) == DATA
    assert store.ranges == [(0, len(DATA) - 1)]


def test_a_slow_store_that_ignores_ranges_is_read_on_as_one_stream(out: int) -> None:
    """Its first answer is a 200 of the whole file: parts could not be had from it, so the stream is not ended."""
    store = RangedStore(rate=16 << 20, whole=True)
    try:
        got = download(Reader(store.url), _file(), out, _limits(probe_seconds=0.05), "blob")
    finally:
        store.close()
    assert got == hashlib.sha256(DATA).hexdigest()
    assert _written(out) == DATA
    assert store.ranges == [(0, len(DATA) - 1)]


@pytest.mark.parametrize("rate", [0, 4 << 20], ids=["one-stream", "split"])
def test_a_stream_cut_mid_body_resumes_from_the_byte_it_reached(out: int, rate: int) -> None:
    cut = (1 << 20) + 12345
    store = RangedStore(rate=rate, cut_first_at=cut)
    try:
        got = download(Reader(store.url), _file(), out, _limits(probe_seconds=0.5), "blob")
    finally:
        store.close()
    assert got == hashlib.sha256(DATA).hexdigest()
    assert _written(out) == DATA
    assert store.ranges[:2] == [(0, len(DATA) - 1), (cut, len(DATA) - 1)], store.ranges[:3]


@pytest.mark.parametrize("rate", [0, 4 << 20], ids=["one-stream", "split"])
def test_bytes_that_do_not_match_the_pin_are_refused(out: int, rate: int) -> None:
    store = RangedStore(rate=rate)
    try:
        with pytest.raises(SourceError) as info:
            download(Reader(store.url), _file("0" * 64), out, _limits(probe_seconds=0.2), "blob")
    finally:
        store.close()
    assert info.value.reason == CHECKSUM_MISMATCH
    assert (len(store.ranges) > 1) == bool(rate), store.ranges
