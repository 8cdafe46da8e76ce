"""status.pods of an InferenceServer: each pod's start, phase by phase, from its status and its server's."""

from __future__ import annotations

import datetime as dt

from kubeinfer.operator.servers.pod_start import PHASES, complete, pod_timeline


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


T = _epoch("2026-12-02T13:00:00Z")


def _pod(container_started: bool = True) -> dict:
    status: dict = {
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-02T13:00:01Z"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-02T13:00:01Z"},
        ],
        "containerStatuses": [
            {"name": "sidecar", "state": {"running": {"startedAt": "2026-12-02T13:00:09Z"}}},
            {
                "name": "server",
                "state": {"running": {"startedAt": "2026-12-02T13:00:04Z"}}
                if container_started
                else {"waiting": {"reason": "ContainerCreating"}},
            },
        ],
    }
    return {"metadata": {"name": "pool-abc", "creationTimestamp": "2026-12-02T13:00:00Z"}, "status": status}


def test_a_started_pod_has_every_phase_in_order_with_the_seconds_between():
    entry = pod_timeline(_pod(), {"started_at": T + 4.1, "listening_at": T + 4.5, "models_ready_at": T + 6.25})
    assert complete(entry)
    assert [p for p in entry if p in dict(PHASES)] == [p for p, _ in PHASES]
    times = [_epoch(entry[p]) for p, _ in PHASES]
    assert times == sorted(times) and times[0] == T
    assert entry["seconds"] == {"scheduled": 1.0, "containerStarted": 3.0, "listening": 0.5, "modelsReady": 1.75}
    assert entry["listening"] == "2026-12-02T13:00:04.500Z"


def test_a_pod_still_starting_shows_what_is_known_and_is_not_complete():
    entry = pod_timeline(_pod(container_started=False), None)
    assert entry["name"] == "pool-abc" and "containerStarted" not in entry and "listening" not in entry
    assert entry["seconds"] == {"scheduled": 1.0}
    assert not complete(entry)
    # a server still loading its models: listening, not ready
    loading = pod_timeline(_pod(), {"started_at": T + 4.1, "listening_at": T + 4.5, "models_ready_at": None})
    assert "listening" in loading and "modelsReady" not in loading and not complete(loading)


def test_clock_skew_never_shows_a_negative_phase_and_junk_is_ignored():
    # the pod's times are whole seconds: a server that listened within the container's first second
    entry = pod_timeline(_pod(), {"listening_at": T + 3.9, "models_ready_at": "soon"})
    assert entry["seconds"]["listening"] == 0.0 and "modelsReady" not in entry
    assert pod_timeline({"metadata": {"name": "x"}}, {"listening_at": True}) == {"name": "x"}
