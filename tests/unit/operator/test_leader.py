"""Leader election rules (client-go's): expiry on the locally observed time, followers' liveness."""

from __future__ import annotations

import datetime as dt
import logging

import httpx
import pytest
from kubeinfer.operator.leader import LeaseElector, _Record
from kubeinfer.operator.liveness import FollowerLiveness, parse_url
from kubeinfer.operator.logs import UNLOAD_WAIT, ExpectedRetries


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
        e.observe(record("other", 60 - step * 0.1))
        assert e.held_by_other(e._observed)  # type: ignore[arg-type]
    # the record stops changing: expired lease_seconds after it was last seen to change
    frozen = e._observed
    clock.t += 14
    e.observe(frozen)  # type: ignore[arg-type]
    assert e.held_by_other(frozen)  # type: ignore[arg-type]
    clock.t += 2
    assert not e.held_by_other(frozen)  # type: ignore[arg-type]


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


def test_unload_waits_are_not_errors():
    rec = logging.LogRecord(
        "kopf.objects",
        logging.ERROR,
        "",
        0,
        f"Handler 'model-delete' failed temporarily: {UNLOAD_WAIT} versions [1]",
        None,
        None,
    )
    assert ExpectedRetries().filter(rec) and rec.levelno == logging.INFO
    other = logging.LogRecord("kopf.objects", logging.ERROR, "", 0, "Handler failed: boom", None, None)
    assert ExpectedRetries().filter(other) and other.levelno == logging.ERROR
