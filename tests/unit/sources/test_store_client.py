"""The stores' one HTTP client against real sockets: a redirect to a refused address is never connected to, and
credentials never follow a redirect to another origin (a registry's blob sent to a CDN, a Hub file to its LFS
store)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
from kubeinfer.server.sources.errors import REFUSED, SourceError

from tests.support import hostile


@pytest.fixture
def servers() -> Iterator[tuple[hostile.HostileServer, hostile.HostileServer]]:
    first, second = hostile.HostileServer(), hostile.HostileServer(host="127.0.0.2")
    yield first, second
    first.close()
    second.close()


def test_a_redirect_to_a_refused_address_is_refused_and_never_connected(servers) -> None:
    first, blocked = servers
    first.routes["/blob"] = hostile.redirect(f"{blocked.url}/data")
    blocked.routes["/data"] = hostile.file(b"secret of 127.0.0.2")
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.1/32"])))
    with pytest.raises(SourceError) as info:
        with client.request("GET", httpx.URL(f"{first.url}/blob"), {}, namespace="ns", where="blob", follow=True):
            pass
    assert info.value.reason == REFUSED and "redirect 1 of blob" in info.value.message
    assert "loopback" in info.value.message
    assert blocked.seen.paths == []


def test_credentials_go_to_the_first_origin_only(servers) -> None:
    first, other = servers
    first.routes["/blob"] = hostile.redirect(f"{other.url}/cdn")
    other.routes["/cdn"] = hostile.file(b"layer bytes")
    client = StoreClient(AddressPolicy(allowed=parse_networks(["127.0.0.0/8"])))
    headers = {"Authorization": "Bearer registry-token"}
    with client.request("GET", httpx.URL(f"{first.url}/blob"), headers, namespace="ns", where="blob", follow=True) as a:
        assert a.status == 200 and a.read() == b"layer bytes"
    assert first.seen.requests[0].headers.get("authorization") == "Bearer registry-token"
    assert "authorization" not in other.seen.requests[0].headers
