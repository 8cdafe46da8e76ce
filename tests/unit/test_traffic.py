"""Traffic weights between versions (server/config/traffic.py) and the draw (runtime.registry.weighted_version)."""

from __future__ import annotations

import collections
from typing import Any

import pytest
from kubeinfer.server.config import ConfigError, parse_config_text, validate_config
from kubeinfer.server.config.traffic import parse_traffic, render_traffic, routing_neutral_digest
from kubeinfer.server.runtime.registry import weighted_version

BASE = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def _config(traffic: str | None) -> Any:
    extra = f'parameters {{ key: "kubeinfer.version_traffic" value {{ string_value: "{traffic}" }} }}\n'
    return parse_config_text(BASE + (extra if traffic is not None else ""))


def test_parse_and_render_round_trip() -> None:
    weights = parse_traffic(_config("1:90, 2:10"))
    assert weights == {1: 90.0, 2: 10.0}
    assert render_traffic(weights) == "1:90,2:10"
    assert render_traffic({3: 12.5, 1: 87.5}) == "1:87.5,3:12.5"
    assert parse_traffic(_config(None)) == {} and parse_traffic(_config("")) == {}


@pytest.mark.parametrize("bad", ["1:ninety", "1=90", "0:100", "1:101", "1:-1", "1:50,1:50", "1:0,2:0", "x"])
def test_bad_values_are_refused_by_validation(bad: str) -> None:
    with pytest.raises(ConfigError, match="kubeinfer.version_traffic"):
        validate_config(_config(bad), "m")


def test_the_digest_ignores_only_the_weights() -> None:
    a, b = _config("1:90,2:10"), _config("1:50,2:50")
    assert routing_neutral_digest(a) == routing_neutral_digest(b) == routing_neutral_digest(_config(None))
    c = _config("1:90,2:10")
    c.max_batch_size = 8
    assert routing_neutral_digest(c) != routing_neutral_digest(a)


def test_draws_follow_the_weights_of_the_serving_versions() -> None:
    serving: dict[int, Any] = {1: object(), 2: object()}
    seen = collections.Counter(weighted_version({1: 90, 2: 10}, serving) for _ in range(20_000))
    assert 0.085 <= seen[2] / 20_000 <= 0.115
    # a weighted version that does not serve: the others share everything
    assert {weighted_version({1: 90, 3: 10}, serving) for _ in range(200)} == {1}
    # no weighted version serves: no choice (the caller takes the highest)
    assert weighted_version({3: 100}, serving) is None
    assert {weighted_version({1: 0, 2: 100}, serving) for _ in range(200)} == {2}


def test_a_sequence_always_draws_the_same_version() -> None:
    serving: dict[int, Any] = {1: object(), 2: object()}
    by_sequence = {cid: weighted_version({1: 50, 2: 50}, serving, cid) for cid in range(1, 401)}
    assert all(weighted_version({1: 50, 2: 50}, serving, cid) == v for cid, v in by_sequence.items())
    share = sum(1 for v in by_sequence.values() if v == 2) / len(by_sequence)
    assert 0.35 <= share <= 0.65  # and sequences still spread by the weights
    assert weighted_version({1: 50, 2: 50}, serving, "session-7") == weighted_version(
        {1: 50, 2: 50}, serving, "session-7"
    )
