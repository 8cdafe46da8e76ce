"""Canary weights, numbers per version and the rollout rule (operator/traffic/rollout.py); spec.modelCache flags
(operator/servers/model_cache.py); models loaded on demand in the status (operator/api/status.py). Pure functions,
and `Rollouts.extend` reading a replica's statistics over real HTTP."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from kubeinfer.operator.api.model_types import InferenceModel, InferenceModelSpec, Rollout
from kubeinfer.operator.api.server_types import InferenceServerSpec
from kubeinfer.operator.api.status import ModelObservation, ReplicaView, model_status, version_states
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.replicas.indexes import Endpoint, IndexReader
from kubeinfer.operator.replicas.server_access import PLAIN
from kubeinfer.operator.servers import model_cache
from kubeinfer.operator.servers.manifests import reserved_extra_args, server_args
from kubeinfer.operator.traffic import rollout
from kubeinfer.operator.traffic.rollout import Numbers, RolloutWindow, judge
from kubeinfer.server.config import ConfigError
from kubeinfer.server.config.traffic import TRAFFIC_PARAMETER
from kubeinfer.server.repository.layout import NOT_LOADED
from kubeinfer.server.vocabulary.statistics import LATENCY_KEY, ROUTED_KEY

BOUNDS = [1_000.0, 10_000.0, 100_000.0]  # µs


def _spec(weights: dict[int, int] | None = None, **extra: object) -> dict:
    versions = []
    for v in (1, 2):
        entry: dict = {"version": v, "source": {"path": f"m/{v}.onnx"}}
        if weights and v in weights:
            entry["trafficPercent"] = weights[v]
        versions.append(entry)
    return {
        "server": "pool",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": 4,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": versions,
        **extra,
    }


def test_weights_render_into_the_parameter_and_load_both_versions() -> None:
    rendered = render_model("m", _spec({1: 90, 2: 10}))
    assert rendered.config.parameters[TRAFFIC_PARAMETER].string_value == "1:90,2:10"
    assert list(rendered.config.version_policy.specific.versions) == [1, 2]
    assert 'key: "kubeinfer.version_traffic"' in rendered.config_text
    plain = render_model("m", _spec())
    assert TRAFFIC_PARAMETER not in plain.config.parameters and not plain.config.HasField("version_policy")
    # the weights a rollout decision put in force win over the spec's
    decided = render_model("m", _spec({1: 90, 2: 10}), traffic={1: 100.0, 2: 0.0})
    assert decided.config.parameters[TRAFFIC_PARAMETER].string_value == "1:100,2:0"


def test_weights_that_cannot_be_served_are_refused() -> None:
    with pytest.raises(ConfigError, match="add up to 110, not 100"):
        render_model("m", _spec({1: 90, 2: 20}))
    with pytest.raises(ConfigError, match="versionPolicy does not load"):
        render_model("m", _spec({1: 90, 2: 10}, versionPolicy={"latest": {"numVersions": 1}}))
    rendered = render_model("m", _spec({1: 90, 2: 10}, versionPolicy={"all": {}}))
    assert rendered.config.version_policy.HasField("all")


def test_weights_in_force_follow_a_decision_of_the_same_generation() -> None:
    spec = _spec({1: 90, 2: 10}, rollout={"maxErrorRate": 0.05})
    status = {
        "rollout": {
            "phase": "RolledBack",
            "generation": 4,
            "weights": [{"version": 1, "trafficPercent": 100}, {"version": 2, "trafficPercent": 0}],
        }
    }
    typed = InferenceModelSpec.from_body({"spec": spec})
    assert rollout.weights_in_force(typed, status, 4) == {1: 100.0, 2: 0.0}
    assert rollout.weights_in_force(typed, status, 5) == {1: 90.0, 2: 10.0}  # a new spec: its own weights
    # without a rollout rule the spec's weights stay whatever the status says
    plain = InferenceModelSpec.from_body({"spec": _spec({1: 90, 2: 10})})
    assert rollout.weights_in_force(plain, status, 4) == {1: 90.0, 2: 10.0}


def test_a_watch_event_older_than_a_decision_is_told_apart() -> None:
    decided = {
        "metadata": {"generation": 4},
        "status": {
            "rollout": {
                "phase": "RolledBack",
                "generation": 4,
                "weights": [{"version": 1, "trafficPercent": 100}, {"version": 2, "trafficPercent": 0}],
            }
        },
    }
    before = {"metadata": {"generation": 4}, "status": {"rollout": {"phase": "Progressing", "generation": 4}}}
    assert rollout.decision_lost(decided, before)  # written before the decision, arrived after it
    assert rollout.decision_lost(decided, {"metadata": {"generation": 4}})
    assert not rollout.decision_lost(decided, decided)  # the decision's own write
    assert not rollout.decision_lost(decided, {**before, "metadata": {"generation": 5}})  # a new spec
    assert not rollout.decision_lost(before, decided)


def test_p99_interpolates_within_its_bucket() -> None:
    n = Numbers(100, 0, BOUNDS, [50, 49, 1, 0])  # 99th request is the last of the 1-10 ms bucket
    assert n.quantile(0.99) == pytest.approx(10_000.0)
    n = Numbers(100, 0, BOUNDS, [0, 0, 100, 0])
    assert n.quantile(0.5) == pytest.approx(55_000.0)
    assert Numbers(5, 0, BOUNDS, [0, 0, 0, 5]).quantile(0.99) == BOUNDS[-1]  # +Inf: the highest finite bound
    assert Numbers().quantile(0.99) is None


def test_the_window_counts_growth_per_replica_and_survives_a_restart() -> None:
    t = RolloutWindow()
    t.observe({"a": {2: Numbers(1000, 10, BOUNDS, [1010, 0, 0, 0])}}, now=0)  # baseline only
    t.observe({"a": {2: Numbers(1100, 15, BOUNDS, [1115, 0, 0, 0])}}, now=10)
    t.observe({"a": {2: Numbers(20, 5, BOUNDS, [25, 0, 0, 0])}, "b": {2: Numbers(7, 0, BOUNDS, [7, 0, 0, 0])}}, now=20)
    window, covered = t.window(60, now=20)
    # a: 100+5, then 20+5 after its restart; b joined after the first read: its 7 are new
    assert (window[2].success, window[2].failure, covered) == (127, 10, 20)
    window, _ = t.window(5, now=20)
    assert (window[2].success, window[2].failure) == (27, 5)
    t.observe({"b": {2: Numbers(17, 0, BOUNDS, [17, 0, 0, 0])}}, now=30)
    assert t.window(5, now=30)[0][2].success == 10
    # a replica that joins after the first read (a new pod): all it counted is in the window
    t.observe({"c": {2: Numbers(3, 1, BOUNDS, [4, 0, 0, 0])}}, now=40)
    assert (t.window(5, now=40)[0][2].success, t.window(5, now=40)[0][2].failure) == (3, 1)


def test_a_replica_without_a_latency_series_keeps_the_others_p99() -> None:
    """A replica that served none of a version's requests has no latency series for it yet (its statistics
    row has no histogram): its counts add, the other replica's histogram stays, so the p99 is there (the
    canary e2e once saw requests counted with no p99)."""
    t = RolloutWindow()
    t.observe({"a": {2: Numbers()}, "b": {2: Numbers()}}, now=0)
    t.observe({"a": {2: Numbers(50, 0, BOUNDS, [0, 50, 0, 0])}, "b": {2: Numbers()}}, now=10)
    t.observe({"b": {2: Numbers()}, "a": {2: Numbers(60, 0, BOUNDS, [0, 60, 0, 0])}}, now=20)
    window, _ = t.window(60, now=20)
    assert window[2].requests == 60 and window[2].quantile(0.99) is not None
    assert Numbers(5, 1, BOUNDS, [6, 0, 0, 0]).plus(Numbers(2, 0)) == Numbers(7, 1, BOUNDS, [6, 0, 0, 0])
    assert Numbers(2, 0).plus(Numbers(5, 1, BOUNDS, [6, 0, 0, 0])) == Numbers(7, 1, BOUNDS, [6, 0, 0, 0])


def _window(success: int, failure: int, counts: list[int]) -> dict[int, Numbers]:
    return {1: Numbers(900, 0, BOUNDS, [900, 0, 0, 0]), 2: Numbers(success, failure, BOUNDS, counts)}


def test_the_rule_rolls_back_promotes_or_waits() -> None:
    rule = Rollout(window_seconds=60, min_requests=100, max_error_rate=0.05, max_p99_milliseconds=50, promote=True)
    weights = {1: 90.0, 2: 10.0}
    phase, message, _ = judge(rule, 2, weights, _window(40, 20, [60, 0, 0, 0]), 30)
    assert phase == "Progressing" and "60 of the 100 requests" in message
    phase, message, decided = judge(rule, 2, weights, _window(80, 40, [120, 0, 0, 0]), 30)
    assert phase == "RolledBack" and "error rate above 0.05" in message and decided == {1: 100.0, 2: 0.0}
    phase, message, _ = judge(rule, 2, weights, _window(120, 0, [0, 0, 120, 0]), 30)
    assert phase == "RolledBack" and "p99 above 50 ms" in message
    phase, _, _ = judge(rule, 2, weights, _window(120, 1, [121, 0, 0, 0]), 30)
    assert phase == "Progressing"  # within the limits, but the window is not full yet
    phase, message, decided = judge(rule, 2, weights, _window(120, 1, [121, 0, 0, 0]), 60)
    assert phase == "Promoted" and decided == {1: 0.0, 2: 100.0}
    three = {1: 60.0, 2: 30.0, 3: 10.0}
    _, _, decided = judge(rule, 3, three, {3: Numbers(0, 200, BOUNDS, [200, 0, 0, 0])}, 60)
    assert decided == {1: pytest.approx(200 / 3), 2: pytest.approx(100 / 3), 3: 0.0}
    assert rollout.canary_of({1: 90, 2: 10}) == 2 and rollout.canary_of({1: 0, 2: 100}) is None
    assert rollout.canary_of({1: 100}) is None


def _row(version: int, ok: int, failed: int, routed: tuple[int, int] | None) -> dict:
    """A statistics row as the server writes it: Triton's counts and the latency histogram of every request,
    and (once the weights sent the version any) the counts and histogram of the routed ones."""
    row: dict = {
        "name": "m",
        "version": str(version),
        "inference_stats": {"success": {"count": ok, "ns": 0}, "fail": {"count": failed, "ns": 0}},
        LATENCY_KEY: {"bounds_us": BOUNDS, "counts": [ok + failed, 0, 0, 0]},
    }
    if routed is not None:
        row[ROUTED_KEY] = {
            "success": {"count": routed[0], "ns": 0},
            "fail": {"count": routed[1], "ns": 0},
            LATENCY_KEY: {"bounds_us": BOUNDS, "counts": [0, sum(routed), 0, 0]},
        }
    return row


def test_only_requests_the_weights_routed_are_judged() -> None:
    """Callers that name version 2 (``/versions/2/infer``) are outside the weighted split: their failures, or
    their fast successes, are in Triton's counts of the row and must neither roll the canary back nor
    promote it; only the routed numbers (``ROUTED_KEY``) reach the window and the rule."""
    rule = Rollout(window_seconds=60, min_requests=100, max_error_rate=0.05, max_p99_milliseconds=None)
    weights = {1: 90.0, 2: 10.0}

    def read(v2_all: tuple[int, int], v2_routed: tuple[int, int] | None) -> dict[str, dict[int, Numbers]]:
        rows = [_row(1, 900, 0, (900, 0)), _row(2, *v2_all, v2_routed)]
        return {"a": rollout.numbers_from_stats({"model_stats": rows})}

    # steering towards a rollback: 500 failing requests pinned to version 2, 120 healthy routed ones
    t = RolloutWindow()
    t.observe(read((0, 0), None), now=0)
    t.observe(read((120, 500), (120, 0)), now=30)
    window, covered = t.window(60, now=30)
    assert (window[2].success, window[2].failure) == (120, 0)
    assert window[2].quantile(0.99) == pytest.approx(BOUNDS[0] + (BOUNDS[1] - BOUNDS[0]) * 0.99)
    assert judge(rule, 2, weights, window, covered)[0] == "Progressing"
    assert rollout.version_traffic(weights, window, covered)[1]["failures"] == 0
    # steering towards a promotion: 1,000 fast successes pinned, 40 routed ones (short of minRequests)
    t = RolloutWindow()
    t.observe(read((0, 0), None), now=0)
    t.observe(read((1040, 0), (40, 0)), now=60)
    window, covered = t.window(60, now=60)
    phase, message, _ = judge(rule, 2, weights, window, covered)
    assert phase == "Progressing" and "40 of the 100 requests" in message
    # a row without the field (no routed request yet, or an older server) counts none
    assert rollout.numbers_from_stats({"model_stats": [_row(2, 50, 50, None)]})[2].requests == 0


def test_model_cache_flags() -> None:
    spec = InferenceServerSpec.from_body(
        {
            "spec": {
                "image": "x",
                "modelCache": {"memoryBudget": "4Gi", "idleUnloadSeconds": 600, "loadTimeoutSeconds": 30},
            }
        }
    )
    args = server_args(spec)
    assert model_cache.server_flags(spec) == [
        "--model-load-on-demand=true",
        "--model-cache-memory-budget=4Gi",
        "--model-idle-unload-seconds=600",
        "--model-load-timeout=30",
    ]
    assert all(f in args for f in model_cache.server_flags(spec))
    bare = {"image": "x"}
    assert model_cache.server_flags(InferenceServerSpec.from_body({"spec": {**bare, "modelCache": {}}})) == [
        "--model-load-on-demand=true"
    ]
    assert model_cache.server_flags(InferenceServerSpec.from_body({"spec": bare})) == []
    assert reserved_extra_args(
        InferenceServerSpec.from_body({"spec": {**bare, "server": {"extraArgs": ["--model-cache-memory-budget=1Gi"]}}})
    )


def test_a_model_loaded_on_demand_is_ready() -> None:
    index = [{"name": "m", "version": "", "state": "UNAVAILABLE", "reason": NOT_LOADED}]
    loaded = [{"name": "m", "version": "1", "state": "READY", "reason": "", "config_digest": "c1"}]
    obs = ModelObservation(generation=1, target=[1], rendered=[1], config_digest="c1")
    obs.replicas = [
        ReplicaView("a", True, version_states(index, "m")),
        ReplicaView("b", True, version_states(loaded, "m")),
    ]
    status = model_status(obs, None, when="t")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and "loaded on demand: now on 1 of 2 replicas" in ready["message"]
    assert status["activeVersions"] == [1]
    assert status["versionStates"][0]["state"] == "ON_DEMAND" and status["versionStates"][0]["readyReplicas"] == 2


class _Stats:
    """A replica's ``GET /v2/models/m/stats``, served over real HTTP; ``routed`` is what it has counted."""

    def __init__(self) -> None:
        self.routed: dict[int, tuple[int, int]] = {1: (0, 0), 2: (0, 0)}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                rows = [_row(v, ok, failed, (ok, failed)) for v, (ok, failed) in outer.routed.items()]
                body = json.dumps({"model_stats": rows}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def test_a_reconcile_reads_the_replicas_judges_the_window_and_keeps_its_decision() -> None:
    """``Rollouts.extend`` over the model's ``RolloutWindow``: the first read is the baseline, a failing canary
    is rolled back once it had minRequests, the decision stays for its generation, and a spec without weights
    clears the window."""
    stats = _Stats()
    clock = [0.0]
    rollouts = rollout.Rollouts(IndexReader(timeout=5), now=lambda: clock[0])
    window = RolloutWindow()
    spec = _spec({1: 90, 2: 10}, rollout={"minRequests": 20, "maxErrorRate": 0.1})
    body = {"metadata": {"name": "m", "namespace": "ns", "uid": "u", "generation": 3}, "spec": spec}
    endpoints = [Endpoint(stats.url, "pod-a")]
    try:
        new: dict = {}
        _, decision = rollouts.extend(window, InferenceModel.from_body(body), new, endpoints, PLAIN, "t0")
        assert decision is None and window.generation == 3 and new["rollout"]["phase"] == "Progressing"
        stats.routed = {1: (180, 0), 2: (15, 10)}
        clock[0] = 10.0
        extra, decision = rollouts.extend(window, InferenceModel.from_body(body), new, endpoints, PLAIN, "t1")
        assert decision is not None and "error rate above 0.1" in decision
        assert new["rollout"]["phase"] == "RolledBack" and not extra[0].status
        assert [r["failures"] for r in new["versionTraffic"]] == [0, 10]
        decided = {**body, "status": {"rollout": new["rollout"]}}
        assert rollout.weights_in_force(InferenceModel.from_body(decided).spec, decided["status"], 3) == {
            1: 100.0,
            2: 0.0,
        }
        again: dict = {}
        _, decision = rollouts.extend(window, InferenceModel.from_body(decided), again, endpoints, PLAIN, "t2")
        assert decision is None and again["rollout"] == new["rollout"]  # final for its generation
        plain = {**body, "spec": _spec()}
        _, decision = rollouts.extend(window, InferenceModel.from_body(plain), again, endpoints, PLAIN, "t3")
        assert again["rollout"] is None and again["versionTraffic"] is None and window.generation is None
    finally:
        stats.httpd.shutdown()
