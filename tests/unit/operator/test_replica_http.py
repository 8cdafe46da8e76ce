"""The operator's reads from replicas are bounded in bytes and in time, against a real local HTTP server that
answers too much (150 MB, as the pod posing as a replica did), too slowly (a drip), or not at all.

The index, statistics, poll and start-up reads each stop early: the operator holds at most about the read's
cap (measured with tracemalloc), the server sees its connection closed long before it sent everything, and a
drip ends at the read's deadline however short the per-read timeout makes each wait. A too-large or too-slow
answer is the same as an unreachable replica for the caller.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubeinfer.operator.controllers.server_reconcile import ServerController
from kubeinfer.operator.replicas.indexes import INDEX_MAX_BYTES, Endpoint, IndexReader
from kubeinfer.operator.replicas.nudge import Nudger
from kubeinfer.operator.replicas.server_access import PLAIN
from kubeinfer.operator.traffic.rollout import StatsReader

from tests.support.hostile import HostileServer, drip, send

#: what the pod posing as a replica sent
HUGE = 150 << 20
MiB = 1 << 20
PATHS = ("/v2/repository/index", "/v2/repository/poll", "/v2/models/m/stats", "/v2/kubeinfer/startup")


class Sent:
    """Bytes a route wrote before the client went away."""

    def __init__(self) -> None:
        self.bytes = 0
        self.done = threading.Event()


def huge(sent: Sent, total: int = HUGE, chunk: int = MiB) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """A route: a JSON-looking answer of ``total`` bytes (``[`` and spaces: nothing to decode but the bytes), as
    fast as the client takes it, close-delimited; ``sent`` counts what got out before the client closed."""

    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        try:
            h.wfile.write(b"[")
            while sent.bytes < total:
                h.wfile.write(b" " * chunk)
                sent.bytes += chunk
            h.wfile.write(b"]")
            h.wfile.flush()
        finally:
            sent.done.set()

    return route


def silent(stop: threading.Event) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """A route that takes the request and never answers (until ``stop``)."""
    return lambda h: stop.wait(60)


def serve(route: Callable[[http.server.BaseHTTPRequestHandler], None]) -> HostileServer:
    return HostileServer(dict.fromkeys(PATHS, route))


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def measured(call: Callable[[], Any], limit: float) -> tuple[Any, float, int]:
    """(what ``call`` returned, seconds it took, peak bytes it allocated); fails if it takes over ``limit``
    seconds (an unbounded read would otherwise hold the test for as long as the server goes on)."""
    out: list[Any] = []
    tracemalloc.start()
    started = time.monotonic()
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(limit)
    took = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert not thread.is_alive(), f"the read was still going after {limit:g} s"
    return out[0], took, peak


# --------------------------------------------------------------------------------- each read the operator makes


def test_an_index_answer_of_150_mb_is_dropped_at_the_cap() -> None:
    sent = Sent()
    server = serve(huge(sent))
    reader = IndexReader(timeout=5)
    try:
        read, took, peak = measured(lambda: reader.read(Endpoint(server.url, "pod"), 60), 60)
        assert read.rows is None and "AnswerTooLarge" in read.error, read.error
        assert peak < INDEX_MAX_BYTES + 8 * MiB, f"{peak / MiB:.0f} MiB held"
        assert sent.done.wait(10)
        # the server noticed the closed connection after the cap and what the sockets' buffers took
        assert sent.bytes < INDEX_MAX_BYTES + 16 * MiB, f"{sent.bytes / MiB:.0f} MiB sent"
        assert reader.read(Endpoint(server.url, "pod"), 60).error == read.error  # remembered like a failure
    finally:
        reader.close()
        server.close()


def test_an_index_answer_that_drips_ends_at_the_reads_deadline(stop: threading.Event) -> None:
    """A byte every 0.2 s never trips the 1 s per-read timeout: only the deadline of the whole read ends it."""
    server = serve(drip(stop, 0.2, b" "))
    reader = IndexReader(timeout=1)
    reader.deadline = 2.0
    try:
        read, took, _ = measured(lambda: reader.read(Endpoint(server.url, "pod"), 60), 10)
        assert read.rows is None and "AnswerTooSlow" in read.error, read.error
        assert 1.9 <= took < 3.0, took
    finally:
        stop.set()
        reader.close()
        server.close()


def test_an_index_nested_too_deeply_is_an_unreadable_replica_not_a_crash() -> None:
    server = serve(lambda h: send(h, 200, b"[" * 200_000 + b"]" * 200_000))
    reader = IndexReader(timeout=5)
    try:
        read = reader.read(Endpoint(server.url, "pod"), 60)
        assert read.rows is None and "nested too deeply" in read.error, read.error
    finally:
        reader.close()
        server.close()


def test_statistics_are_bounded_too(stop: threading.Event) -> None:
    sent = Sent()
    server = serve(huge(sent))
    reader = IndexReader(timeout=5)
    stats = StatsReader(reader)
    try:
        out, _, peak = measured(lambda: stats.read([Endpoint(server.url, "pod")], "m"), 60)
        assert out == {} and peak < 8 * MiB, f"{peak / MiB:.0f} MiB held"
        assert sent.done.wait(10) and sent.bytes < 24 * MiB, f"{sent.bytes / MiB:.0f} MiB sent"
    finally:
        server.close()
    server = serve(drip(stop, 0.2, b" "))
    reader.deadline = 2.0
    try:
        out, took, _ = measured(lambda: stats.read([Endpoint(server.url, "pod")], "m"), 10)
        assert out == {} and took < 3.0, took
    finally:
        stop.set()
        reader.close()
        server.close()


def test_a_poll_requests_answer_is_bounded_too(stop: threading.Event) -> None:
    """The poll answer comes after the replica loaded the models, so its deadline is the nudger's timeout."""
    sent = Sent()
    server = serve(huge(sent))
    reader = IndexReader(timeout=5)
    answered: list[Any] = []
    finished = threading.Event()

    def done(url: str, access: Any, names: list[str], rows: Any) -> None:
        answered.append(rows)
        finished.set()

    nudger = Nudger(reader.client_for, done, timeout=2.0, linger=0.0)
    try:
        tracemalloc.start()
        (ticket,) = nudger.nudge(server.url, PLAIN, ["m"])
        assert finished.wait(30), "no answer to the poll request"
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert answered == [None] and ticket.wait(1) is None
        assert peak < INDEX_MAX_BYTES + 8 * MiB, f"{peak / MiB:.0f} MiB held"
        assert sent.done.wait(10) and sent.bytes < INDEX_MAX_BYTES + 16 * MiB, f"{sent.bytes / MiB:.0f} MiB sent"
        finished.clear()
        server.close()
        server = serve(drip(stop, 0.2, b" "))
        started = time.monotonic()
        nudger.nudge(server.url, PLAIN, ["m"])
        assert finished.wait(10), "the dripping poll answer did not end"
        assert time.monotonic() - started < 3.5 and answered[-1] is None
    finally:
        stop.set()
        nudger.close()
        reader.close()
        server.close()


def test_a_start_up_timeline_is_bounded_too(stop: threading.Event) -> None:
    sent = Sent()
    server = serve(huge(sent))
    owner = SimpleNamespace(reader=IndexReader(timeout=5))  # what ServerController._startup uses of itself
    try:
        out, _, peak = measured(lambda: ServerController._startup(owner, server.url, PLAIN), 60)  # type: ignore[arg-type]
        assert out is None and peak < 8 * MiB, f"{peak / MiB:.0f} MiB held"
        assert sent.done.wait(10) and sent.bytes < 24 * MiB, f"{sent.bytes / MiB:.0f} MiB sent"
        server.close()
        server = serve(drip(stop, 0.2, b" "))
        out, took, _ = measured(lambda: ServerController._startup(owner, server.url, PLAIN), 10)  # type: ignore[arg-type]
        assert out is None and took < 3.0, took
    finally:
        stop.set()
        owner.reader.close()
        server.close()


# --------------------------------------------------------------------------------- the helper's own rules


def test_the_deadline_holds_however_long_the_per_read_timeout(stop: threading.Event) -> None:
    """Silence before the answer's head, and a drip after it, both end at the deadline (1 s), not at the
    per-read timeout (5 s)."""
    from kubeinfer.operator.replicas.replica_http import ReplicaClient, TooSlow

    client = ReplicaClient(timeout=5)
    for route in (silent(stop), drip(stop, 0.2, b" ")):
        server = serve(route)
        started = time.monotonic()
        try:
            with pytest.raises(TooSlow, match="1 s"):
                client.exchange("GET", f"{server.url}/v2/kubeinfer/startup", max_bytes=MiB, deadline=1.0)
            assert time.monotonic() - started < 1.5
        finally:
            server.close()
    stop.set()
    client.close()


def test_a_declared_length_over_the_cap_and_a_coded_answer_are_refused() -> None:
    from kubeinfer.operator.replicas.replica_http import AnswerError, ReplicaClient, TooLarge

    def declared(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(100 << 30))
        h.end_headers()
        h.wfile.write(b"[]")

    client = ReplicaClient(timeout=5)
    server = serve(declared)
    try:
        with pytest.raises(TooLarge, match=f"declares {100 << 30} bytes"):
            client.exchange("GET", f"{server.url}/v2/kubeinfer/startup", max_bytes=MiB, deadline=5)
    finally:
        server.close()
    bomb = gzip.compress(b" " * (64 * MiB))  # 64 KiB on the wire
    server = serve(lambda h: send(h, 200, bomb, Content_Encoding="gzip"))
    try:
        with pytest.raises(AnswerError, match="EncodingRefused"):
            client.exchange("GET", f"{server.url}/v2/kubeinfer/startup", max_bytes=MiB, deadline=5)
        assert server.seen.requests[0].headers["accept-encoding"] == "identity"
    finally:
        server.close()
        client.close()


def test_an_answer_within_the_limits_is_read_whole() -> None:
    from kubeinfer.operator.replicas.replica_http import ReplicaClient

    body = b'[{"name": "m", "version": "1", "state": "READY"}]'
    server = serve(lambda h: send(h, 200, body, Content_Type="application/json"))
    client = ReplicaClient(timeout=5)
    try:
        for _ in range(3):
            answer = client.exchange(
                "POST", f"{server.url}/v2/repository/index", json_body={}, max_bytes=len(body), deadline=5
            )
            assert answer.status == 200 and answer.json() == [{"name": "m", "version": "1", "state": "READY"}]
        assert len(server.seen.requests) == 3
    finally:
        server.close()
        client.close()


def test_a_pool_with_tls_and_a_token_is_read_over_https_with_its_token(tmp_path: Path) -> None:
    """``spec.auth``: the reader's client for the pool's TLS set-up verifies the server against the Secret's CA
    and sends the token; an answer from a server the CA did not sign is an unreadable replica."""
    from kubeinfer.operator.replicas.server_access import ServerAccess

    from tests.support.https import ScriptedServer, make_ca_and_cert

    ca, cert, key = make_ca_and_cert(tmp_path)
    rows = b'[{"name": "m", "version": "1", "state": "READY"}]'
    server = ScriptedServer(
        {"/v2/repository/index": lambda auth: (200, {}, rows) if auth == "Bearer t0ken" else (401, {}, b"")},
        tls=(cert, key),
    )
    reader = IndexReader(timeout=5, workdir=str(tmp_path))
    access = ServerAccess("https", {"Authorization": "Bearer t0ken"}, "pool-ca", ca.read_bytes())
    (tmp_path / "other").mkdir()
    other_ca, _, _ = make_ca_and_cert(tmp_path / "other")
    stranger = ServerAccess("https", {"Authorization": "Bearer t0ken"}, "other-ca", other_ca.read_bytes())
    plain_url = server.url.replace("https://", "http://")  # endpoints are plain URLs; the access makes them https
    try:
        read = reader.read(Endpoint(plain_url, "pod"), 60, access)
        assert read.rows == [{"name": "m", "version": "1", "state": "READY"}], read.error
        refused = reader.read(Endpoint(plain_url, "pod"), 0, stranger)
        assert refused.rows is None and "CERTIFICATE_VERIFY_FAILED" in refused.error, refused.error
    finally:
        reader.close()
        server.close()
