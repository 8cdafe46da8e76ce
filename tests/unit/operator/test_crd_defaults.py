"""The defaults the InferenceServer CRD states (descriptions and the ports' CEL rule) are generated from their
one home: the server's flag defaults (``kubeinfer.server.vocabulary.server_defaults``) and the operator's pod
defaults (``kubeinfer.operator.manifests``). Each test changes a home and sees the generated text follow."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubeinfer.operator import manifests, server_crd


@pytest.fixture
def regenerate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set manifests' constants, then the InferenceServer spec schema generated from them; restored after."""

    def build(**homes: Any) -> dict[str, Any]:
        for name, value in homes.items():
            monkeypatch.setattr(manifests, name, value)
        importlib.reload(server_crd)
        return server_crd.INFERENCE_SERVER_SPEC["properties"]

    yield build
    monkeypatch.undo()
    importlib.reload(server_crd)  # in the same module namespace: every holder of its functions sees the real one


def _described(prop: dict[str, Any]) -> str:
    return " ".join(prop["description"].split())


def test_ports_in_descriptions_and_the_cel_rule_come_from_the_server(regenerate: Any) -> None:
    spec = regenerate(DEFAULT_PORTS={"http": 18000, "grpc": 18001, "metrics": 18002})
    server = spec["server"]
    assert _described(server["properties"]["httpPort"]) == "HTTP/REST port (default 18000)."
    assert _described(server["properties"]["grpcPort"]) == "gRPC port (default 18001)."
    assert _described(server["properties"]["metricsPort"]) == "Prometheus metrics port (default 18002)."
    ports = (
        "[has(self.httpPort) ? self.httpPort : 18000, has(self.grpcPort) ? self.grpcPort : 18001, "
        "has(self.metricsPort) ? self.metricsPort : 18002]"
    )
    (rule,) = server["x-kubernetes-validations"]
    assert rule["rule"] == f"{ports}.all(p, {ports}.exists_one(q, q == p))"


def test_server_timing_defaults_in_descriptions(regenerate: Any) -> None:
    spec = regenerate(DEFAULT_POLL_SECONDS=7, SHUTDOWN_SECONDS=41, CONNECTION_DRAIN_SECONDS=2, EXIT_MARGIN_SECONDS=4)
    flags = spec["server"]["properties"]
    assert "(--repository-poll-secs, default 7)" in _described(flags["pollIntervalSeconds"])
    shutdown = _described(flags["shutdownTimeoutSeconds"])
    assert "(--shutdown-timeout, default 41)" in shutdown
    assert "terminationGracePeriodSeconds is drainSeconds + this + 6." in shutdown


def test_pod_defaults_in_descriptions(regenerate: Any) -> None:
    probes = {
        "liveness": {"periodSeconds": 11, "timeoutSeconds": 2, "failureThreshold": 4},
        "readiness": {"periodSeconds": 6, "timeoutSeconds": 3, "failureThreshold": 5},
        "startup": {"periodSeconds": 12, "timeoutSeconds": 4, "failureThreshold": 61},
    }
    spec = regenerate(DEFAULT_SHM="3Gi", DEFAULT_DRAIN_SECONDS=17, PROBE_DEFAULTS=probes)
    assert "/dev/shm (default 3Gi)" in _described(spec["sharedMemorySize"])
    assert _described(spec["drainSeconds"]).endswith("before the server drains (default 17).")
    for kind, values in probes.items():
        timing = spec["probes"]["properties"][kind]["properties"]
        assert _described(timing["periodSeconds"]) == f"Seconds between probes (default {values['periodSeconds']})."
        assert f"(default {values['timeoutSeconds']})" in _described(timing["timeoutSeconds"])
        assert f"(default {values['failureThreshold']})" in _described(timing["failureThreshold"])


def test_the_real_crd_states_the_real_defaults() -> None:
    """Back in its home state, the generated text names the values the operator and the server use."""
    flags = server_crd.INFERENCE_SERVER_SPEC["properties"]["server"]["properties"]
    assert f"(default {manifests.DEFAULT_PORTS['grpc']})" in _described(flags["grpcPort"])
    assert f"default {manifests.SHUTDOWN_SECONDS})" in _described(flags["shutdownTimeoutSeconds"])
