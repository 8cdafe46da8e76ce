"""The defaults the CRDs state (descriptions, bounds and the ports' CEL rule) are generated from their one
home: the server's flag defaults (``kubeinfer.server.vocabulary.server_defaults``), the operator's pod
defaults (``kubeinfer.operator.api.server_spec``) and Triton's version policy (``kubeinfer.server.config.
version_policy``). Each test changes a home and sees the generated text follow."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubeinfer.operator.api import descriptions, model_crd, schema, server_crd, server_spec, server_types
from kubeinfer.server.config import ConfigError, parse_config_text, validate_config, version_policy


@pytest.fixture
def regenerate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set server_spec's constants, then the typed spec and the schema generated from them; restored after."""

    def build(**homes: Any) -> dict[str, Any]:
        for name, value in homes.items():
            monkeypatch.setattr(server_spec, name, value)
        importlib.reload(server_types)  # the typed spec states the defaults; the CRD's spec is generated from it
        importlib.reload(server_crd)
        return server_crd.INFERENCE_SERVER_SPEC["properties"]

    yield build
    monkeypatch.undo()
    importlib.reload(server_types)
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
    assert f"(default {server_spec.DEFAULT_PORTS['grpc']})" in _described(flags["grpcPort"])
    assert f"default {server_spec.SHUTDOWN_SECONDS})" in _described(flags["shutdownTimeoutSeconds"])


def test_the_version_policy_default_in_the_model_crd_comes_from_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    def described() -> str:
        return _described(model_crd.inference_model_spec_schema()["properties"]["versionPolicy"])

    assert f"latest (default, the newest {version_policy.DEFAULT_NUM_VERSIONS})," in described()
    monkeypatch.setattr(version_policy, "DEFAULT_NUM_VERSIONS", 3)
    monkeypatch.setattr(schema, "CONFIG_FIELDS", importlib.reload(descriptions).CONFIG_FIELDS)
    try:
        assert "latest (default, the newest 3)," in described()
    finally:
        monkeypatch.undo()
        importlib.reload(descriptions)


def test_the_model_crd_and_the_server_agree_on_the_fewest_versions() -> None:
    """numVersions' minimum in the CRD is the one the server's validation enforces (and names)."""
    policy = model_crd.inference_model_spec_schema()["properties"]["versionPolicy"]["properties"]
    assert policy["latest"]["properties"]["numVersions"]["minimum"] == version_policy.MIN_NUM_VERSIONS
    too_few = version_policy.MIN_NUM_VERSIONS - 1
    config = parse_config_text(
        f'platform: "onnxruntime_onnx" version_policy {{ latest {{ num_versions: {too_few} }} }}'
    )
    with pytest.raises(ConfigError, match=f"at least {version_policy.MIN_NUM_VERSIONS}$"):
        validate_config(config)
