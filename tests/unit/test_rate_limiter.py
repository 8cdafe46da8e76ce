"""The rate limiter's resource accounting, errors and priorities (Triton core src/rate_limiter.cc)."""

from __future__ import annotations

import pytest
from kubeinfer.server.config import pb
from kubeinfer.server.scheduling.rate_limiter import GLOBAL, PER_DEVICE, RateLimiter, parse_resource
from kubeinfer.server.vocabulary.errors import InvalidArgument


def limits(*resources: tuple[str, int, bool], priority: int = 0) -> pb.ModelRateLimiter:
    m = pb.ModelRateLimiter(priority=priority)
    for name, count, is_global in resources:
        r = m.resources.add(name=name, count=count)
        setattr(r, "global", is_global)
    return m


def test_parse_resource() -> None:
    assert parse_resource("R1:10") == ("R1", 10, PER_DEVICE)
    assert parse_resource("R2:5:1") == ("R2", 5, 1)
    for bad in ("R1", "R1:x", "R1:1:2:3"):
        with pytest.raises(ValueError, match="--rate-limit-resource option format is"):
            parse_resource(bad)


def test_default_counts_are_the_largest_asked_for() -> None:
    # Triton's docs: A [R1:4 R2:4], B [R2:5 R3:10 R4:5], C [R1:1 R3:7 R4:2] -> R1 4, R2 5, R3 10, R4 5
    rl = RateLimiter()
    rl.register("a", [(limits(("R1", 4, False), ("R2", 4, False)), 0)])
    rl.register("b", [(limits(("R2", 5, False), ("R3", 10, False), ("R4", 5, False)), 0)])
    rl.register("c", [(limits(("R1", 1, False), ("R3", 7, False), ("R4", 2, False)), 0)])
    assert rl.available == {0: {"R1": 4, "R2": 5, "R3": 10, "R4": 5}}


def test_explicit_counts_and_errors() -> None:
    rl = RateLimiter([("resource1", 1, PER_DEVICE)])
    with pytest.raises(InvalidArgument) as e:
        rl.register("m", [(limits(("resource1", 4, False)), 0)])
    assert str(e.value) == (
        'Resource count for "resource1" is limited to 1 which will prevent scheduling of one or more model '
        "instances, the minimum required count is 4"
    )
    # a resource on another device only: none here
    rl = RateLimiter([("resource1", 10, 10)])
    with pytest.raises(InvalidArgument, match='"resource1" is limited to 0 '):
        rl.register("m", [(limits(("resource1", 4, False)), 0)])
    # global resources take any device's entry; the explicit count replaces the default
    rl = RateLimiter([("g", 3, 5), ("d", 6, PER_DEVICE)])
    rl.register("m", [(limits(("g", 2, True), ("d", 1, False)), 0)])
    assert rl.available == {GLOBAL: {"g": 3}, 0: {"d": 6}}


def test_global_and_device_specific_conflict() -> None:
    rl = RateLimiter()
    rl.register("a", [(limits(("r", 2, True)), 0)])
    with pytest.raises(InvalidArgument, match='Resource "r" is present as both global and device-specific resource'):
        rl.register("b", [(limits(("r", 2, False)), 0)])
    assert rl.available == {GLOBAL: {"r": 2}}  # the failed registration left nothing behind


def test_resources_held_and_released() -> None:
    rl = RateLimiter()
    a, b = rl.register("m", [(limits(("R", 1, False)), 0), (limits(("R", 1, False)), 0)])
    (c,) = rl.register("other", [(limits(("R", 1, False)), 1)])  # device 1: its own copy
    granted: list[str] = []
    rl.stage(a, lambda: granted.append("a"))
    rl.stage(b, lambda: granted.append("b"))
    rl.stage(c, lambda: granted.append("c"))
    # only the first staged instance is tried (Triton's AttemptAllocation): b waits, and c behind it
    assert granted == ["a"]
    rl.release(a)
    assert granted == ["a", "b", "c"]
    rl.unregister([a, b, c])


def test_priority_two_runs_half_as_often() -> None:
    rl = RateLimiter()
    (one,) = rl.register("p1", [(limits(("R", 1, False), priority=1), 0)])
    (two,) = rl.register("p2", [(limits(("R", 1, False), priority=2), 0)])
    runs: list[str] = []
    holder: list[object] = []

    def grant(name: str, ticket: object) -> None:
        runs.append(name)
        holder.append(ticket)

    rl.stage(one, lambda: grant("1", one))
    rl.stage(two, lambda: grant("2", two))
    for _ in range(300):  # both always have work: each release stages the instance again
        ticket = holder.pop(0)
        name = "1" if ticket is one else "2"
        rl.release(ticket, restage=lambda t=ticket, n=name: grant(n, t))  # type: ignore[misc]
    assert 1.9 < runs.count("1") / runs.count("2") < 2.1
