"""The stores' one HTTP client against real sockets: a redirect to a refused address is never connected to, and
credentials never follow a redirect to another origin (a registry's blob sent to a CDN, a Hub file to its LFS
store). Both hold for ``direct`` requests too (the ranged reads of large files, ``direct.DirectGets``, on
``http.client``), which also reuse their connection, read chunked and closing answers whole, end a stalled body by
the timeout and the thread's deadline, and count a cut body as a broken connection (which the downloader resumes)."""

from __future__ import annotations

import http.server
import time
from collections.abc import Iterator

import httpx
import pytest
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
from kubeinfer.server.sources.errors import REFUSED, UNAVAILABLE, SourceError
from kubeinfer.server.sources.guard import deadline_scope

from tests.support import hostile


@pytest.fixture
def servers() -> Iterator[tuple[hostile.HostileServer, hostile.HostileServer]]:
    first, second = hostile.HostileServer(), hostile.HostileServer(host="127.0.0.2")
    yield first, second
    first.close()
    second.close()


@pytest.mark.parametrize("direct", [False, True])
def test_a_redirect_to_a_refused_address_is_refused_and_never_connected(servers, direct: bool) -> None:
    first, blocked = servers
    first.routes["/blob"] = hostile.redirect(f"{blocked.url}/data")
    blocked.routes["/data"] = hostile.file(b"secret of 127.0.0.2")
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])))
    with pytest.raises(SourceError) as info:
        url = httpx.URL(f"{first.url}/blob")
        with client.request("GET", url, {}, namespace="ns", where="blob", follow=True, direct=direct):
            pass
    assert info.value.reason == REFUSED and "redirect 1 of blob" in info.value.message
    assert "loopback" in info.value.message
    assert blocked.seen.paths == []


@pytest.mark.parametrize("direct", [False, True])
def test_credentials_go_to_the_first_origin_only(servers, direct: bool) -> None:
    first, other = servers
    first.routes["/blob"] = hostile.redirect(f"{other.url}/cdn")
    other.routes["/cdn"] = hostile.file(b"layer bytes")
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.0/8"])))
    headers = {"Authorization": "Bearer registry-token"}
    url = httpx.URL(f"{first.url}/blob")
    with client.request("GET", url, headers, namespace="ns", where="blob", follow=True, direct=direct) as a:
        assert a.status == 200 and a.read() == b"layer bytes"
    assert first.seen.requests[0].headers.get("authorization") == "Bearer registry-token"
    assert "authorization" not in other.seen.requests[0].headers


def get(client: StoreClient, url: str) -> bytes:
    with client.request("GET", httpx.URL(url), {}, namespace="ns", where="blob", direct=True) as answer:
        return answer.read(64 << 20)


def test_direct_gets_read_whole_bodies_on_one_reused_connection(servers) -> None:
    server, _ = servers
    data = bytes(range(256)) * (3 << 12)  # 3 MiB: many reads of the reused buffer
    server.routes["/big"] = hostile.file(data)
    server.routes["/small"] = hostile.file(b"small")
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])))
    assert get(client, f"{server.url}/big") == data
    assert get(client, f"{server.url}/small") == b"small"
    assert get(client, f"{server.url}/big") == data
    assert len(client.backend.connected) == 1


def cut_short(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(206)
    h.send_header("Content-Length", "1000")
    h.end_headers()
    h.wfile.write(b"x" * 10)
    h.wfile.flush()
    h.close_connection = True


def test_a_direct_body_cut_short_is_a_broken_connection(servers) -> None:
    server, _ = servers
    server.routes["/cut"] = cut_short
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])))
    with pytest.raises(SourceError) as info:
        get(client, f"{server.url}/cut")
    assert info.value.reason == UNAVAILABLE and "broke off" in info.value.message


def test_a_stalled_direct_body_ends_by_the_timeout_and_by_the_deadline(servers) -> None:
    server, _ = servers
    server.routes["/stall"] = hostile.declared(100)
    server.routes["/drip"] = hostile.drip(server.stop, 0.05)
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])), timeout=0.5)
    with pytest.raises(SourceError) as info:
        get(client, f"{server.url}/stall")
    assert info.value.reason == UNAVAILABLE and "sent nothing for 0.5 s" in info.value.message
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])), timeout=30)
    started = time.monotonic()
    with pytest.raises(SourceError) as info, deadline_scope(started + 0.5):
        get(client, f"{server.url}/drip")  # bytes keep coming: only the deadline ends it
    assert info.value.reason == UNAVAILABLE and time.monotonic() - started < 5


def closing(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "5")
    h.send_header("Connection", "close")
    h.end_headers()
    h.wfile.write(b"close")
    h.close_connection = True


def chunked(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for part in (b"chunked ", b"body"):
        h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
    h.wfile.write(b"0\r\n\r\n")


def test_direct_answers_that_close_or_come_in_chunks_are_read_whole(servers) -> None:
    server, _ = servers
    server.routes["/close"] = closing
    server.routes["/chunked"] = chunked
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])))
    assert get(client, f"{server.url}/close") == b"close"
    assert get(client, f"{server.url}/chunked") == b"chunked body"  # on a new connection: the first was closed
    assert get(client, f"{server.url}/chunked") == b"chunked body"  # on the second again: read to its end
    assert len(client.backend.connected) == 2
