"""Status documents from what a reconcile observed."""

from __future__ import annotations

import copy
import random
from typing import Any

from kubeinfer.operator.api.status import (
    Condition,
    ModelObservation,
    ReplicaView,
    VersionState,
    conditions,
    model_status,
    status_changed,
    version_states,
)

INDEX = [
    {"name": "m", "version": "1", "state": "READY", "reason": "", "config_digest": "c1"},
    {"name": "m", "version": "2", "state": "LOADING", "reason": ""},
    {"name": "other", "version": "1", "state": "READY", "reason": ""},
]


def _conds(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def _obs(target, states, digest="", generation=3, rendered=None):
    obs = ModelObservation(generation=generation, target=target, rendered=rendered or target, config_digest=digest)
    return obs.single(states)


def test_ready_when_every_target_version_is_ready():
    status = model_status(_obs([1], version_states(INDEX, "m"), digest="c1"), None, when="t0")
    assert _conds(status) == {
        "Rendered": ("True", "RepositoryUpToDate"),
        "Ready": ("True", "Serving"),
        "Degraded": ("False", "AsDesired"),
    }
    assert status["activeVersions"] == [1] and status["activeVersion"] == 1
    assert status["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])
    assert status["versionStates"][0] == {
        "version": 1,
        "state": "READY",
        "reason": "",
        "replicas": 1,
        "readyReplicas": 1,
    }


def test_loading_then_failure_keeps_serving_and_degrades():
    obs = _obs([2], version_states(INDEX, "m"), rendered=[1, 2])
    assert _conds(model_status(obs, None))["Ready"] == ("False", "Loading")
    obs.render_error = ("ChecksumMismatch", "version 2: bad")
    obs.failed_version = 2
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "ChecksumMismatch")
    assert _conds(status)["Degraded"] == ("True", "ChecksumMismatch")
    assert status["lastFailure"]["version"] == 2
    failed = [{"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "bad onnx"}, INDEX[0]]
    status = model_status(_obs([2], version_states(failed, "m"), rendered=[1, 2]), None)
    assert _conds(status)["Ready"] == ("False", "LoadFailed")
    assert "bad onnx" in status["lastFailure"]["message"]


def test_unreachable_server():
    obs = ModelObservation(generation=1, target=[1], rendered=[1]).single(None, "connection refused")
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "ServerUnreachable")
    assert "connection refused" in status["conditions"][1]["message"]


def test_no_replicas():
    obs = ModelObservation(generation=1, target=[1], rendered=[1], server="pool", index_error="no endpoints")
    assert _conds(model_status(obs, None))["Ready"] == ("False", "ServerUnavailable")


def test_a_config_only_change_is_ready_only_once_the_server_loaded_that_config():
    old = [VersionState(1, "READY", "", "digest-of-old-config")]
    status = model_status(_obs([1], old, digest="digest-of-new-config"), None)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Loading")
    assert "new config of versions [1]" in ready["message"]
    assert status["versionStates"][0]["readyReplicas"] == 0
    new = [VersionState(1, "READY", "", "digest-of-new-config")]
    assert _conds(model_status(_obs([1], new, digest="digest-of-new-config"), None))["Ready"] == ("True", "Serving")
    # a server that reports no digest is judged on versions alone
    assert _conds(model_status(_obs([1], [VersionState(1, "READY")], digest="x"), None))["Ready"][0] == "True"


def test_a_config_the_server_refused_is_a_load_failure():
    refused = [VersionState(1, "READY", "reload failed: bad dims", "old")]
    status = model_status(_obs([1], refused, digest="new"), None)
    assert _conds(status)["Ready"] == ("False", "LoadFailed")
    assert _conds(status)["Degraded"] == ("True", "LoadFailed")
    assert "bad dims" in status["lastFailure"]["message"]


def _replicas(*states_per_replica, ready=None):
    ready = ready or [True] * len(states_per_replica)
    return [ReplicaView(f"pod-{i}", r, s) for i, (s, r) in enumerate(zip(states_per_replica, ready, strict=True))]


def test_several_replicas_ready_only_when_all_serve_the_target():
    both = ModelObservation(generation=1, target=[2], rendered=[1, 2], config_digest="c")
    v1 = [VersionState(1, "READY", "", "c")]
    v2 = [VersionState(1, "UNLOADING", "", ""), VersionState(2, "READY", "", "c")]
    both.replicas = _replicas(v2, v1, v2)
    status = model_status(both, None)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Loading")
    assert "version 2 on 2 of 3 replicas" in ready["message"]
    rows = {r["version"]: r for r in status["versionStates"]}
    assert rows[2] == {"version": 2, "state": "READY", "reason": "", "replicas": 3, "readyReplicas": 2}
    assert rows[1]["state"] == "UNLOADING"  # the state furthest from READY
    assert status["activeVersions"] == [1, 2]
    both.replicas = _replicas(v2, v2, v2)
    status = model_status(both, None)
    assert _conds(status)["Ready"] == ("True", "Serving")
    assert "on 3 replicas" in status["conditions"][1]["message"]


def test_not_ready_replicas_do_not_count_unless_none_is_ready():
    obs = ModelObservation(generation=1, target=[1], rendered=[1], config_digest="c")
    good = [VersionState(1, "READY", "", "c")]
    obs.replicas = _replicas(good, None, ready=[True, False])  # a starting pod is not in the Service yet
    assert _conds(model_status(obs, None))["Ready"] == ("True", "Serving")
    failed = [VersionState(1, "UNAVAILABLE", "out of memory")]
    obs.replicas = _replicas(failed, failed, ready=[False, False])
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "LoadFailed")
    assert (
        "on replica pod-" in status["conditions"][1]["message"] and "out of memory" in status["lastFailure"]["message"]
    )
    obs.replicas = _replicas(good, ready=[False])
    assert _conds(model_status(obs, None))["Ready"] == ("False", "ServerNotReady")


def test_an_unreadable_ready_replica_blocks_ready():
    obs = ModelObservation(generation=1, target=[1], rendered=[1])
    obs.replicas = [ReplicaView("a", True, [VersionState(1, "READY")]), ReplicaView("b", True, None, "timeout")]
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "ServerUnreachable")
    assert "replicas b" in status["conditions"][1]["message"]


def test_unchanged_status_is_not_rewritten():
    obs = _obs([1], version_states(INDEX, "m"), digest="c1")
    first = model_status(obs, None, when="t0")
    stored = {k: v for k, v in first.items() if v is not None}  # what the API keeps of the merge patch
    second = model_status(obs, stored, when="t1")
    assert not status_changed(stored, second)
    obs.generation = 4
    assert status_changed(stored, model_status(obs, stored, when="t2"))
    # the same failure on every resync keeps its first time stamp: still no write
    failing = _obs([1], None, digest="c1")
    failing.render_error = ("FetchFailed", "cannot download")
    a = model_status(failing, stored, when="t3")
    kept = {k: v for k, v in a.items() if v is not None}
    b = model_status(failing, kept, when="t4")
    assert b["lastFailure"]["time"] == "t3" and not status_changed(kept, b)
    # a field that goes away (activeVersion -> None) is a change
    assert status_changed({"activeVersion": 1}, {"activeVersion": None})


def test_transition_time_kept_while_status_unchanged():
    first = conditions([Condition("Ready", True, "Serving")], None, 1, when="t0")
    second = conditions([Condition("Ready", True, "Serving", "new message")], first, 2, when="t1")
    third = conditions([Condition("Ready", False, "Loading")], second, 3, when="t2")
    assert [c[0]["lastTransitionTime"] for c in (first, second, third)] == ["t0", "t0", "t2"]


def test_a_download_waiting_for_a_slot_is_not_a_failure():
    failing = _obs([1], None, digest="c1")
    failing.render_error = ("FetchFailed", "cannot download")
    failed = model_status(failing, None, when="t0")
    queued = _obs([1], None, digest="c1")
    queued.render_error = ("Queued", "namespace 'a' already runs 2 downloads")
    waiting = model_status(queued, failed, when="t1")
    ready = next(c for c in waiting["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Queued")
    assert waiting["lastFailure"] == failed["lastFailure"]  # the last real failure stays; the wait is not one
    assert model_status(queued, None, when="t2")["lastFailure"] is None


def _pruned(value: Any) -> Any:
    """What the API stores of a merge patch: keys with None values are absent (the reference for the
    in-place comparison)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _reference_changed(previous: dict[str, Any], new: dict[str, Any]) -> bool:
    before, after = _pruned(previous), _pruned(new)
    return any(before.get(k) != v for k, v in after.items()) or any(
        k not in after and new.get(k, ...) is None for k in before
    )


def _value(rng: random.Random, depth: int) -> Any:
    pick = rng.random()
    if depth > 2 or pick < 0.35:
        return rng.choice([None, 0, 1, "a", "b", True, 1.5])
    if pick < 0.7:
        return {rng.choice("xyz"): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]


def test_status_changed_agrees_with_comparing_pruned_copies():
    """The in-place comparison against the straightforward one (prune both, compare) on random statuses,
    stored ones as the API keeps them (no None), new ones often a small change of the stored."""
    rng = random.Random(29)
    for _ in range(5000):
        stored = _pruned({k: _value(rng, 0) for k in rng.sample("abcd", rng.randint(0, 4))})
        new = copy.deepcopy(stored) if rng.random() < 0.5 else {}
        for k in rng.sample("abcde", rng.randint(0, 2)):
            new[k] = _value(rng, 0)
        assert status_changed(stored, new) == _reference_changed(stored, new), (stored, new)


def test_compact_columns_say_which_versions_serve_on_how_many_replicas():
    obs = ModelObservation(generation=1, target=[2], rendered=[1, 2], config_digest="c")
    v1 = [VersionState(1, "READY", "", "c")]
    v2 = [VersionState(1, "UNLOADING", "", ""), VersionState(2, "READY", "", "c")]
    obs.replicas = _replicas(v2, v1, v2)
    status = model_status(obs, None)
    assert (status["servingVersions"], status["servingReplicas"]) == ("1,2", "2/3")
    obs.replicas = _replicas(v2, v2, None, ready=[True, True, False])  # a starting pod: found, not serving
    assert (model_status(obs, None)["servingVersions"], model_status(obs, None)["servingReplicas"]) == ("2", "2/3")
    obs.replicas = []
    status = model_status(obs, None)
    assert (status["servingVersions"], status["servingReplicas"]) == (None, "0/0")
    demand = ModelObservation(generation=1, target=[1], rendered=[1]).single([VersionState(0, "ON_DEMAND")])
    assert model_status(demand, None)["servingReplicas"] == "1/1"  # a model cache loads it on its next request
