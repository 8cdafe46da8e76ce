"""Leader election rules (client-go's): expiry on the locally observed time, followers' liveness."""

from __future__ import annotations

import copy
import datetime as dt
import threading

import httpx
import pytest
from kubeinfer.operator.kube.leader import LeaseElector, _Record
from kubeinfer.operator.liveness import FollowerLiveness, parse_url
from kubernetes.client import V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def record(holder: str, renewed_minutes_ago: float) -> _Record:
    renewed = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=renewed_minutes_ago)
    return _Record(holder, 15, renewed, renewed, 1)


def elector(clock: Clock) -> LeaseElector:
    return LeaseElector(None, "ns", "lease", "me", lease_seconds=15, renew_deadline=10, retry_seconds=2, clock=clock)  # type: ignore[arg-type]


def test_expiry_is_judged_on_local_observation_not_the_holders_clock():
    clock = Clock()
    e = elector(clock)
    # the holder's clock is an hour behind: its renewTime looks ancient, yet the lease keeps changing
    for step in range(5):
        clock.t += 5
        seen = record("other", 60 - step * 0.1)
        e.observe(seen)
        assert e.held_by_other(seen)
    # the record stops changing: expired lease_seconds after it was last seen to change
    clock.t += 14
    e.observe(seen)
    assert e.held_by_other(seen)
    clock.t += 2
    assert not e.held_by_other(seen)


def test_a_fresh_follower_waits_a_full_lease_even_for_a_recent_renew_time():
    clock = Clock()
    e = elector(clock)
    r = record("other", 0)
    e.observe(r)
    clock.t += 14.9
    assert e.held_by_other(r)
    clock.t += 0.2
    assert not e.held_by_other(r)


def test_released_or_own_lease_is_free():
    e = elector(Clock())
    released = _Record("", 1, None, None, 3)
    e.observe(released)
    assert not e.held_by_other(released)
    own = _Record("me", 15, None, None, 3)
    e.observe(own)
    assert not e.held_by_other(own)


def test_timings_must_nest():
    with pytest.raises(ValueError):
        LeaseElector(None, "ns", "l", "me", lease_seconds=10, renew_deadline=10, retry_seconds=2)  # type: ignore[arg-type]


def test_follower_liveness_answers_while_the_election_loop_runs():
    healthy = [True]
    live = FollowerLiveness("http://127.0.0.1:0/healthz", lambda: healthy[0])
    live.start()
    try:
        base = f"http://127.0.0.1:{live.port}"
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/other").status_code == 404
        healthy[0] = False
        assert httpx.get(f"{base}/healthz").status_code == 500
    finally:
        live.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{base}/healthz")  # the port is free for kopf
    assert parse_url("http://0.0.0.0:8080/healthz") == ("0.0.0.0", 8080, "/healthz")
    with pytest.raises(ValueError):
        parse_url("0.0.0.0:8080")


# ---- losing the lease: the leader stops (lost + stop set) before a follower may take over -----------------
class FakeLeases:
    """One Lease behind CoordinationV1Api's read/replace; every read advances ``clock`` by 2 s, the
    renew loop's pace, so the loop's decisions follow the number of calls, not the wall clock."""

    def __init__(self, clock: Clock, stop: threading.Event) -> None:
        self.clock = clock
        self.stop = stop
        now = dt.datetime.now(dt.timezone.utc)
        spec = V1LeaseSpec(
            holder_identity="me", lease_duration_seconds=15, acquire_time=now, renew_time=now, lease_transitions=0
        )
        self.lease = V1Lease(metadata=V1ObjectMeta(name="lease", namespace="ns"), spec=spec)
        self.reads = 0
        self.replaces = 0
        #: read number → what that read does: "fail" (HTTP 500), "conflict" (the replace gets a 409),
        #: "taken" (another operator holds it now), "stop" (the operator is told to stop)
        self.script: dict[int, str] = {}
        self.default = "ok"

    def read_namespaced_lease(self, name: str, namespace: str) -> V1Lease:
        self.reads += 1
        self.clock.t += 2
        self.action = self.script.get(self.reads, self.default)
        if self.action == "fail":
            raise ApiException(status=500, reason="Internal Server Error")
        if self.action == "taken":
            self.lease.spec.holder_identity = "other"
            self.lease.spec.renew_time = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=self.reads)
        if self.action == "stop":
            self.stop.set()
        return copy.deepcopy(self.lease)

    def replace_namespaced_lease(self, name: str, namespace: str, lease: V1Lease) -> V1Lease:
        if self.action == "conflict":
            raise ApiException(status=409, reason="Conflict")
        self.replaces += 1
        self.lease = copy.deepcopy(lease)
        return lease


def renewing(script: dict[int, str], default: str = "ok") -> tuple[LeaseElector, FakeLeases, threading.Event]:
    """Run ``keep_renewing`` as the holder until it returns (retry period 1 ms of real time)."""
    clock, stop, lost = Clock(), threading.Event(), threading.Event()
    api = FakeLeases(clock, stop)
    timings = {"lease_seconds": 15, "renew_deadline": 10, "retry_seconds": 0.001}
    e = LeaseElector(api, "ns", "lease", "me", clock=clock, **timings)  # type: ignore[arg-type]
    assert e.try_acquire() and e.is_leader
    api.reads = api.replaces = 0
    api.script, api.default = script, default
    e.keep_renewing(stop, lost)
    return e, api, lost


def test_a_lease_taken_over_stops_the_leader_at_once() -> None:
    e, api, lost = renewing({3: "taken"})
    assert lost.is_set() and not e.is_leader
    assert api.reads == 3 and api.replaces == 2  # renewed twice, then never wrote the other holder's lease


def test_renewals_failing_past_the_renew_deadline_stop_the_leader() -> None:
    e, api, lost = renewing({}, default="fail")
    assert lost.is_set() and not e.is_leader
    # attempts at +2, +4, +6, +8 s still fall within the 10 s deadline; the one at +10 s gives up
    assert api.reads == 5 and api.replaces == 0


def test_conflicting_writers_past_the_renew_deadline_stop_the_leader() -> None:
    e, api, lost = renewing({}, default="conflict")
    assert lost.is_set() and not e.is_leader
    assert api.reads == 5


def test_an_outage_shorter_than_the_renew_deadline_keeps_the_lease() -> None:
    e, api, lost = renewing({1: "fail", 2: "fail", 3: "fail", 4: "fail", 8: "stop"})
    assert not lost.is_set() and e.is_leader
    assert api.reads == 8 and api.replaces == 4  # reads 5-8 renewed it
