"""Status documents from what a reconcile observed."""

from __future__ import annotations

from kubeinfer.operator.status import Condition, ModelObservation, conditions, model_status, version_states

INDEX = [
    {"name": "m", "version": "1", "state": "READY", "reason": ""},
    {"name": "m", "version": "2", "state": "LOADING", "reason": ""},
    {"name": "other", "version": "1", "state": "READY", "reason": ""},
]


def _conds(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_when_every_target_version_is_ready():
    obs = ModelObservation(generation=3, target=[1], rendered=[1], states=version_states(INDEX, "m"))
    status = model_status(obs, None, when="t0")
    assert _conds(status) == {
        "Rendered": ("True", "RepositoryUpToDate"),
        "Ready": ("True", "Serving"),
        "Degraded": ("False", "AsDesired"),
    }
    assert status["activeVersions"] == [1] and status["activeVersion"] == 1
    assert status["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])


def test_loading_then_failure_keeps_serving_and_degrades():
    obs = ModelObservation(generation=4, target=[2], rendered=[1, 2], states=version_states(INDEX, "m"))
    assert _conds(model_status(obs, None))["Ready"] == ("False", "Loading")
    obs.render_error = ("ChecksumMismatch", "version 2: bad")
    obs.failed_version = 2
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "ChecksumMismatch")
    assert _conds(status)["Degraded"] == ("True", "ChecksumMismatch")
    assert status["lastFailure"]["version"] == 2
    failed = [{"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "bad onnx"}, INDEX[0]]
    obs = ModelObservation(generation=4, target=[2], rendered=[1, 2], states=version_states(failed, "m"))
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "LoadFailed")
    assert "bad onnx" in status["lastFailure"]["message"]


def test_unreachable_server():
    obs = ModelObservation(generation=1, target=[1], rendered=[1], states=None, index_error="connection refused")
    status = model_status(obs, None)
    assert _conds(status)["Ready"] == ("False", "ServerUnreachable")


def test_transition_time_kept_while_status_unchanged():
    first = conditions([Condition("Ready", True, "Serving")], None, 1, when="t0")
    second = conditions([Condition("Ready", True, "Serving", "new message")], first, 2, when="t1")
    third = conditions([Condition("Ready", False, "Loading")], second, 3, when="t2")
    assert [c[0]["lastTransitionTime"] for c in (first, second, third)] == ["t0", "t0", "t2"]
