"""status.coldStart and the ColdStartBudget condition, from index rows and render records (pure functions)."""

from __future__ import annotations

import datetime as dt

import pytest
from kubeinfer.operator.api.status import ReplicaView, version_states
from kubeinfer.operator.models import cold_start

T0 = 1_800_000_000.0  # an epoch second


def _row(version: str, load: float, warmup: float, first: float | None = None, state: str = "READY") -> dict:
    cold = {"started_at": T0, "load_seconds": load, "warmup_seconds": warmup, "ready_at": T0 + load + warmup}
    if first is not None:
        cold |= {"first_inference_at": T0 + load + warmup + 5, "first_inference_seconds": first}
    return {"name": "m", "version": version, "state": state, "reason": "", "cold_start": cold}


def _replica(name: str, *rows: dict) -> ReplicaView:
    return ReplicaView(name, True, version_states(list(rows), "m"))


def _parse(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


RENDER = cold_start.render_record(1.5, [(1, 1000, 0.75), (2, 24, 0.25)], T0 - 2)


def test_render_record_splits_the_sync_into_fetch_and_the_rest():
    assert RENDER["fetchSeconds"] == 1.0
    assert RENDER["renderSeconds"] == 0.5
    assert RENDER["fetchedBytes"] == 1024
    assert RENDER["artifacts"] == [
        {"version": 1, "bytes": 1000, "seconds": 0.75},
        {"version": 2, "bytes": 24, "seconds": 0.25},
    ]
    assert _parse(RENDER["time"]) == pytest.approx(T0 - 2, abs=0.001)
    # a sync shorter than its fetches (clock granularity) never reports negative seconds
    assert cold_start.render_record(0.1, [(1, 1, 0.2)], T0)["renderSeconds"] == 0.0


def test_replica_records_come_from_ready_rows_with_timings_only():
    replicas = [
        _replica("pod-a", _row("1", 2.0, 0.5, first=0.25), _row("2", 1.0, 0.0, state="LOADING")),
        _replica("pod-b", {"name": "m", "version": "1", "state": "READY", "reason": ""}),  # an older server
        ReplicaView("pod-c", True, None, "unreachable"),
    ]
    (record,) = cold_start.replica_records(replicas)
    assert record["replica"] == "pod-a" and record["version"] == 1
    assert (record["loadSeconds"], record["warmupSeconds"], record["firstInferenceSeconds"]) == (2.0, 0.5, 0.25)
    started, ready, first = (_parse(record[k]) for k in ("loadStarted", "readyTime", "firstInferenceTime"))
    assert started == pytest.approx(T0) and ready == pytest.approx(T0 + 2.5) and first == pytest.approx(T0 + 7.5)


def test_index_rows_with_junk_in_cold_start_are_read_safely():
    rows = [
        {"name": "m", "version": "1", "state": "READY", "cold_start": {"load_seconds": "x", "warmup_seconds": -1}},
        {"name": "m", "version": "2", "state": "READY", "cold_start": ["not", "a", "dict"]},
        {"name": "m", "version": "3", "state": "READY", "cold_start": {"load_seconds": float("nan")}},
    ]
    assert [s.cold_start for s in version_states(rows, "m")] == [(), (), ()]
    assert cold_start.replica_records([ReplicaView("p", True, version_states(rows, "m"))]) == []


def test_no_budget_no_condition():
    records = cold_start.replica_records([_replica("pod-a", _row("1", 2.0, 0.5))])
    assert cold_start.budget_condition(None, RENDER, records) is None


def test_budget_unknown_until_a_replica_reports():
    c = cold_start.budget_condition(10, RENDER, [])
    assert c is not None and (c.status, c.reason) == (None, "NotMeasured")


def test_within_budget_names_the_slowest_replica():
    records = cold_start.replica_records(
        [_replica("pod-a", _row("1", 2.0, 0.5, first=0.25)), _replica("pod-b", _row("1", 3.0, 0.5))]
    )
    c = cold_start.budget_condition(10, RENDER, records)
    assert c is not None and (c.status, c.reason) == (True, "WithinBudget")
    assert "pod-b" in c.message and "5.00s of 10s" in c.message and "no inference yet" in c.message


@pytest.mark.parametrize(
    ("budget", "reason", "total"),
    [
        (0.5, "FetchOverBudget", "1.00s"),  # fetch 1.0 alone
        (1.2, "RenderOverBudget", "1.50s"),  # + render 0.5
        (3.0, "LoadOverBudget", "3.50s"),  # + load 2.0
        (3.7, "WarmupOverBudget", "4.00s"),  # + warm-up 0.5
        (4.1, "FirstInferenceOverBudget", "4.25s"),  # + first inference 0.25
    ],
)
def test_the_condition_names_the_phase_that_broke_the_budget(budget, reason, total):
    records = cold_start.replica_records([_replica("pod-a", _row("1", 2.0, 0.5, first=0.25))])
    c = cold_start.budget_condition(budget, RENDER, records)
    assert c is not None and (c.status, c.reason) == (False, reason)
    assert c.message.startswith("version 1 on replica pod-a:") and c.message.endswith(f"= {total})")


def test_the_slowest_replica_over_budget_is_the_one_named():
    records = cold_start.replica_records(
        [_replica("pod-a", _row("1", 2.0, 0.5)), _replica("pod-b", _row("1", 0.1, 9.0))]
    )
    c = cold_start.budget_condition(2.0, RENDER, records)
    assert c is not None and (c.reason, "pod-b" in c.message) == ("WarmupOverBudget", True)


def test_without_a_render_record_the_replica_phases_alone_count():
    records = cold_start.replica_records([_replica("pod-a", _row("1", 2.0, 0.5))])
    c = cold_start.budget_condition(1.0, None, records)
    assert c is not None and c.reason == "LoadOverBudget"


def test_status_block_keeps_the_last_render_until_a_new_one():
    replicas = [_replica("pod-a", _row("1", 2.0, 0.5))]
    block = cold_start.status_block(RENDER, replicas, None)
    assert block is not None and block["render"] == RENDER and len(block["replicas"]) == 1
    kept = cold_start.status_block(None, replicas, block)
    assert kept is not None and kept["render"] == RENDER
    newer = cold_start.render_record(0.2, [], T0 + 60)
    replaced = cold_start.status_block(newer, replicas, block)
    assert replaced is not None and replaced["render"] == newer
    assert cold_start.status_block(None, [], None) is None
