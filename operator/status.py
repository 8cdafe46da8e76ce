"""Status documents of InferenceModel and InferenceServer. Pure functions; the handlers write the result.

Conditions are written as full lists (a merge patch replaces lists wholesale), keeping each
condition's ``lastTransitionTime`` while its status does not change.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str = ""


def conditions(
    new: Iterable[Condition], previous: Sequence[Mapping[str, Any]] | None, generation: int, when: str | None = None
) -> list[dict[str, Any]]:
    old = {c.get("type"): c for c in previous or ()}
    stamp = when or now()
    out = []
    for c in new:
        status = "Unknown" if c.status is None else ("True" if c.status else "False")
        before = old.get(c.type)
        kept = before.get("lastTransitionTime") if before and before.get("status") == status else None
        out.append(
            {
                "type": c.type,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": kept or stamp,
                "observedGeneration": generation,
            }
        )
    return out


@dataclass(frozen=True)
class VersionState:
    version: int
    state: str
    reason: str = ""


def version_states(index: Iterable[Mapping[str, Any]], model: str) -> list[VersionState]:
    """This model's entries of a ``POST /v2/repository/index`` response."""
    out = []
    for entry in index:
        if entry.get("name") != model:
            continue
        version = str(entry.get("version") or "")
        if not version.isdigit():
            continue
        out.append(VersionState(int(version), str(entry.get("state") or ""), str(entry.get("reason") or "")))
    return sorted(out, key=lambda s: s.version)


@dataclass
class ModelObservation:
    """What one reconcile learned; ``model_status`` turns it into the status document."""

    generation: int
    target: list[int]
    rendered: list[int]
    render_error: tuple[str, str] | None = None  # (reason, message)
    failed_version: int | None = None
    states: list[VersionState] | None = None  # None: the server's index could not be read
    index_error: str = ""
    endpoint: dict[str, str] | None = None
    repository_path: str = ""


def model_status(obs: ModelObservation, previous: Mapping[str, Any] | None, when: str | None = None) -> dict[str, Any]:
    previous = previous or {}
    stamp = when or now()
    active = sorted(s.version for s in obs.states or () if s.state == "READY")
    missing = [v for v in obs.target if v not in active]
    conds: list[Condition] = []
    last_failure = previous.get("lastFailure")
    if obs.render_error:
        reason, message = obs.render_error
        conds.append(Condition("Rendered", False, reason, message))
        last_failure = {"reason": reason, "message": message, "time": stamp}
        if obs.failed_version is not None:
            last_failure["version"] = obs.failed_version
    else:
        conds.append(Condition("Rendered", True, "RepositoryUpToDate", f"versions {obs.rendered} in the repository"))
    failed_loads = [
        s
        for s in obs.states or ()
        if s.version in obs.target and s.state == "UNAVAILABLE" and s.reason and s.reason != "unloaded"
    ]
    if failed_loads and not obs.render_error:
        s = failed_loads[-1]
        last_failure = {
            "version": s.version,
            "reason": "LoadFailed",
            "message": f"version {s.version} failed to load: {s.reason}",
            "time": stamp,
        }
    if obs.render_error:
        ready = Condition("Ready", False, obs.render_error[0], obs.render_error[1])
    elif obs.states is None:
        ready = Condition("Ready", False, "ServerUnreachable", obs.index_error)
    elif failed_loads:
        s = failed_loads[-1]
        ready = Condition("Ready", False, "LoadFailed", f"version {s.version} failed to load: {s.reason}")
    elif missing:
        ready = Condition("Ready", False, "Loading", f"waiting for versions {missing} to be READY on the server")
    else:
        ready = Condition("Ready", True, "Serving", f"versions {active} are READY")
    conds.append(ready)
    serving_something = bool(active)
    degraded = not ready.status and serving_something
    conds.append(
        Condition(
            "Degraded",
            degraded,
            ready.reason if degraded else "AsDesired" if ready.status else "NotServing",
            f"still serving versions {active}: {ready.message}" if degraded else "",
        )
    )
    status: dict[str, Any] = {
        "observedGeneration": obs.generation,
        "conditions": conditions(conds, previous.get("conditions"), obs.generation, stamp),
        "targetVersions": obs.target,
        "activeVersions": active,
        "activeVersion": active[-1] if active else None,
        "renderedVersions": obs.rendered,
        "versionStates": [{"version": s.version, "state": s.state, "reason": s.reason} for s in obs.states or ()],
        "lastFailure": last_failure,
        "endpoint": obs.endpoint,
        "repositoryPath": obs.repository_path or previous.get("repositoryPath"),
    }
    return status
