"""Server replicas from EndpointSlices, and index reads shared between models."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from kubeinfer.operator.replicas.indexes import Endpoint, IndexReader, endpoints_from_slices

from tests.support.https import ScriptedServer


def _slice(endpoints: list[dict], port: int = 8000, address_type: str = "IPv4") -> dict:
    return {
        "addressType": address_type,
        "ports": [{"name": "grpc", "port": 8001}, {"name": "http", "port": port}],
        "endpoints": endpoints,
    }


def test_endpoints_from_slices():
    slices = [
        _slice(
            [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": True}, "targetRef": {"name": "pod-b"}},
                {"addresses": ["10.0.0.1"], "conditions": {}, "targetRef": {"name": "pod-a"}},  # unset ready: ready
                {"addresses": ["10.0.0.3"], "conditions": {"ready": False}, "targetRef": {"name": "pod-c"}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": False, "terminating": True}},
                {"addresses": [], "conditions": {"ready": True}},
            ]
        ),
        _slice([{"addresses": ["fd00::5"], "conditions": {"ready": True}}], port=9000, address_type="IPv6"),
        {
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 8002}],
            "endpoints": [{"addresses": ["1.1.1.1"]}],
        },
    ]
    assert endpoints_from_slices(slices) == [
        Endpoint("http://[fd00::5]:9000", "fd00::5", True),
        Endpoint("http://10.0.0.1:8000", "pod-a", True),
        Endpoint("http://10.0.0.2:8000", "pod-b", True),
        Endpoint("http://10.0.0.3:8000", "pod-c", False),
    ]
    assert endpoints_from_slices([]) == []


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    s = ScriptedServer({})
    yield s
    s.close()


def test_index_reads_are_shared_for_max_age(server):
    rows = [{"name": "m", "version": "1", "state": "READY"}]
    server.routes["/v2/repository/index"] = lambda _: (200, {}, json.dumps(rows).encode())
    reader = IndexReader(timeout=5)
    endpoint = Endpoint(server.url, "pod")
    threads = [threading.Thread(target=reader.read, args=(endpoint, 60)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert reader.requests == 1  # eight concurrent models, one request
    assert reader.read(endpoint, 60).rows == rows
    assert reader.requests == 1
    assert reader.read(endpoint, 0).rows == rows
    assert reader.requests == 2
    reader.close()


def test_failures_are_remembered_too():
    reader = IndexReader(timeout=2)
    dead = Endpoint("http://127.0.0.1:9", "gone")
    first = reader.read(dead, 60)
    assert first.rows is None and "ConnectError" in first.error
    assert reader.read(dead, 60).error == first.error and reader.requests == 1
    reader.close()
