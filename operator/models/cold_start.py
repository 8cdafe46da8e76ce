"""An InferenceModel's cold start in its status, and the ``ColdStartBudget`` condition. Pure functions.

Phases, in the order a new version goes through them: ``fetch`` (its artifacts downloaded or copied, bytes
and seconds: the operator's writer), ``render`` (the rest of the sync: checks, staging, publishing), then
on each server replica ``load``, ``warmup`` and ``firstInference`` (the server measures them and reports
them in its repository index row, ``cold_start``: ``kubeinfer.server.runtime.cold_start``). The operator
reads every replica's index on each resync anyway, so the replica phases cost no extra request.

``spec.coldStartBudgetSeconds`` bounds the whole path, render included, for every replica: the condition
names the phase during which the running sum passed the budget, on the slowest replica.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.status import Condition, ReplicaView

#: the phases in order, as the condition's reason names them (``<Phase>OverBudget``)
PHASES = ("Fetch", "Render", "Load", "Warmup", "FirstInference")
CONDITION = "ColdStartBudget"


def timestamp(epoch: float) -> str:
    """RFC 3339 in UTC with milliseconds (phases are often shorter than a second)."""
    moment = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render_record(
    sync_seconds: float,
    fetched: Iterable[tuple[int, int, float]],
    finished: float | None = None,
    served: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """``status.coldStart.render`` of a sync that changed the model: ``sync_seconds`` its wall clock,
    ``fetched`` (version, bytes, seconds) per artifact, ``finished`` (epoch seconds; default now) when it was
    published, ``served`` what pinned each version a store served."""
    fetched = list(fetched)
    finished = time.time() if finished is None else finished
    artifacts: list[dict[str, Any]] = [{"version": v, "bytes": n, "seconds": round(s, 3)} for v, n, s in fetched]
    for artifact in artifacts:
        if served and artifact["version"] in served:
            artifact["pinnedBy"] = served[artifact["version"]]
    fetch_seconds = sum(s for _, _, s in fetched)
    return {
        "time": timestamp(finished),
        "fetchSeconds": round(fetch_seconds, 3),
        "fetchedBytes": sum(a["bytes"] for a in artifacts),
        "renderSeconds": round(max(0.0, sync_seconds - fetch_seconds), 3),
        "artifacts": artifacts,
    }


def replica_records(replicas: Sequence[ReplicaView]) -> list[dict[str, Any]]:
    """``status.coldStart.replicas``: per replica and serving version, the phases its server reported."""
    out = []
    for replica in replicas:
        for state in replica.states or ():
            cold = dict(state.cold_start)
            if state.state != "READY" or "load_seconds" not in cold:
                continue
            record: dict[str, Any] = {
                "replica": replica.name,
                "version": state.version,
                "loadStarted": timestamp(cold["started_at"]),
                "loadSeconds": round(cold["load_seconds"], 3),
                "warmupSeconds": round(cold.get("warmup_seconds", 0.0), 3),
                "readyTime": timestamp(cold.get("ready_at", cold["started_at"])),
            }
            if "first_inference_seconds" in cold:
                record["firstInferenceTime"] = timestamp(cold.get("first_inference_at", 0.0))
                record["firstInferenceSeconds"] = round(cold["first_inference_seconds"], 3)
            out.append(record)
    return out


@dataclass(frozen=True)
class ColdPath:
    """One replica's cold start of one version: the phases with their seconds, in order."""

    replica: str
    version: int
    phases: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return sum(s for _, s in self.phases)


def paths(render: Mapping[str, Any] | None, replicas: Iterable[Mapping[str, Any]]) -> list[ColdPath]:
    """Every (replica, version) cold start: the last render's phases, then that replica's."""
    head: tuple[tuple[str, float], ...] = ()
    if render:
        head = (("Fetch", float(render.get("fetchSeconds", 0.0))), ("Render", float(render.get("renderSeconds", 0.0))))
    out = []
    for r in replicas:
        tail = [("Load", float(r["loadSeconds"])), ("Warmup", float(r.get("warmupSeconds", 0.0)))]
        if "firstInferenceSeconds" in r:
            tail.append(("FirstInference", float(r["firstInferenceSeconds"])))
        out.append(ColdPath(str(r["replica"]), int(r["version"]), (*head, *tail)))
    return out


def _sum(phases: Iterable[tuple[str, float]]) -> str:
    return " + ".join(f"{p.lower() if p != 'FirstInference' else 'first inference'} {s:.2f}s" for p, s in phases)


def budget_condition(
    budget: float | None, render: Mapping[str, Any] | None, replicas: Sequence[Mapping[str, Any]]
) -> Condition | None:
    """``ColdStartBudget``: True while every replica's cold start fits ``budget`` seconds, False naming the
    phase during which the slowest one passed it, Unknown before any replica reported one; None without a budget."""
    if budget is None:
        return None
    found = paths(render, replicas)
    if not found:
        return Condition(CONDITION, None, "NotMeasured", "no replica serves a version of this model yet")
    over: list[tuple[float, ColdPath, str, int]] = []
    for path in found:
        running = 0.0
        for i, (phase, seconds) in enumerate(path.phases):
            running += seconds
            if running > budget:
                over.append((path.total, path, phase, i))
                break
    if over:
        _, path, phase, i = max(over, key=lambda o: o[0])
        where = f"version {path.version} on replica {path.replica}"
        return Condition(
            CONDITION,
            False,
            f"{phase}OverBudget",
            f"{where}: the cold start passed the budget of {budget:g}s in the {_phase_name(phase)} phase "
            f"({_sum(path.phases[: i + 1])} = {sum(s for _, s in path.phases[: i + 1]):.2f}s)",
        )
    slowest = max(found, key=lambda p: p.total)
    waiting = "" if slowest.phases[-1][0] == "FirstInference" else ", no inference yet"
    return Condition(
        CONDITION,
        True,
        "WithinBudget",
        f"slowest: version {slowest.version} on replica {slowest.replica}, {slowest.total:.2f}s of {budget:g}s "
        f"({_sum(slowest.phases)}{waiting})",
    )


def _phase_name(phase: str) -> str:
    return "first inference" if phase == "FirstInference" else phase.lower()


def status_block(
    render: Mapping[str, Any] | None, replicas: Sequence[ReplicaView], previous: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """``status.coldStart``: the render of this reconcile (else the one the status kept) and the replicas'."""
    kept = (previous or {}).get("render")
    rendered = dict(render) if render is not None else kept
    records = replica_records(replicas)
    if rendered is None and not records:
        return None
    return {"render": rendered, "replicas": records}
