"""Status documents of InferenceModel and InferenceServer. Pure functions; the handlers write the result.

Conditions are written as full lists (a merge patch replaces lists wholesale), keeping each
condition's ``lastTransitionTime`` while its status does not change.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeinfer.server.repository.layout import NOT_LOADED

from .model_status import InferenceModelStatus, LastFailure, ModelEndpoint, VersionStateStatus
from .typed import as_body


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
    #: digest of the config the server loaded this version from ("" when the server does not say)
    config_digest: str = ""
    #: the server's ``cold_start`` of a serving version (phase → seconds or epoch time), as items
    cold_start: tuple[tuple[str, float], ...] = ()


#: a model the server loads on its next request (its model cache): servable, not loaded on that replica
ON_DEMAND = "ON_DEMAND"


def version_states(index: Iterable[Mapping[str, Any]], model: str) -> list[VersionState]:
    """This model's entries of a ``POST /v2/repository/index`` response. A model the server has not loaded
    but loads on demand is one entry, version 0, state ``ON_DEMAND`` (``model_status`` spreads it over the
    target versions)."""
    out = []
    for entry in index:
        if entry.get("name") != model:
            continue
        version = str(entry.get("version") or "")
        if not version and entry.get("reason") == NOT_LOADED:
            out.append(VersionState(0, ON_DEMAND))
            continue
        if not version.isdigit():
            continue
        out.append(
            VersionState(
                int(version),
                str(entry.get("state") or ""),
                str(entry.get("reason") or ""),
                str(entry.get("config_digest") or ""),
                _cold_start(entry.get("cold_start")),
            )
        )
    return sorted(out, key=lambda s: s.version)


def _cold_start(value: Any) -> tuple[tuple[str, float], ...]:
    """The numbers of an index row's ``cold_start`` (anything else in it is ignored, not trusted)."""
    if not isinstance(value, Mapping):
        return ()
    return tuple(
        sorted(
            (str(k), float(v))
            for k, v in value.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        )
    )


@dataclass(frozen=True)
class ReplicaView:
    """One server replica as seen by a reconcile: its states for this model, or why it could not be read."""

    name: str
    ready: bool
    states: list[VersionState] | None
    error: str = ""


@dataclass
class ModelObservation:
    """What one reconcile learned; ``model_status`` turns it into the status document."""

    generation: int
    target: list[int]
    rendered: list[int]
    render_error: tuple[str, str] | None = None  # (reason, message)
    failed_version: int | None = None
    #: every replica of the server that was found (empty: none, see ``index_error``)
    replicas: list[ReplicaView] = field(default_factory=list)
    #: why no replica could be listed or read
    index_error: str = ""
    endpoint: dict[str, str] | None = None
    repository_path: str = ""
    #: digest of the config.pbtxt the operator rendered ("": not known, versions alone decide)
    config_digest: str = ""
    server: str = ""
    #: ``status.coldStart.render`` of a render that changed the model in this reconcile (None: none did)
    render_timing: dict[str, Any] | None = None

    def single(self, states: list[VersionState] | None, error: str = "") -> ModelObservation:
        """Shorthand for one replica (the unit tests, a single server endpoint)."""
        self.replicas = [ReplicaView("server", True, states, error)]
        if states is None:
            self.index_error = error
        return self


#: which state a version shows when replicas disagree: the one furthest from serving
_STATE_ORDER = {"UNAVAILABLE": 0, "LOADING": 1, "UNLOADING": 2, ON_DEMAND: 3, "READY": 4}


def _spread_on_demand(states: Iterable[VersionState], target: Iterable[int]) -> list[VersionState]:
    """A replica's states with its model-level ON_DEMAND entry given to every target version it does not
    report otherwise."""
    states = list(states)
    if not any(s.state == ON_DEMAND for s in states):
        return states
    named = [s for s in states if s.version]
    seen = {s.version for s in named}
    return named + [VersionState(v, ON_DEMAND) for v in target if v not in seen]


#: render "errors" that are a wait, not a failure (status.lastFailure keeps the last real failure)
WAITING = {"Queued"}


def _failed(s: VersionState) -> bool:
    if s.state == "UNAVAILABLE":
        return bool(s.reason) and s.reason != "unloaded"
    return s.state == "READY" and s.reason.startswith("reload failed")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


#: the status parts later steps of a reconcile write (cold start, rollout): ``model_status`` leaves them out,
#: as a merge patch leaves them as stored, rather than writing them null
WRITTEN_ELSEWHERE = ("versionTraffic", "rollout", "coldStart")


def model_status(obs: ModelObservation, previous: Mapping[str, Any] | None, when: str | None = None) -> dict[str, Any]:
    """The status document. Ready only when every ready replica serves every target version from the
    rendered config; with no ready replica, the not-ready ones say why."""
    previous = previous or {}
    stamp = when or now()
    judged = [r for r in obs.replicas if r.ready] or list(obs.replicas)
    any_ready = any(r.ready for r in obs.replicas)
    readable = [r for r in judged if r.states is not None]
    unreadable = [r for r in judged if r.states is None]
    multi = len(judged) > 1

    def current(s: VersionState) -> bool:
        """Serving from the config the operator rendered (servers that report no digest are trusted), or
        serving it on the next request (a model the replica loads on demand reads the config then)."""
        return s.state == ON_DEMAND or (
            s.state == "READY"
            and (not obs.config_digest or not s.config_digest or s.config_digest == obs.config_digest)
        )

    by_version: dict[int, list[tuple[ReplicaView, VersionState]]] = {}
    #: per readable replica, the versions it serves from the rendered config (``servingReplicas``)
    current_versions: list[set[int]] = []
    for r in readable:
        here = set()
        for s in _spread_on_demand(r.states or (), obs.target):
            by_version.setdefault(s.version, []).append((r, s))
            if current(s):
                here.add(s.version)
        current_versions.append(here)
    active = sorted(v for v, seen in by_version.items() if any(s.state in ("READY", ON_DEMAND) for _, s in seen))
    serving = {v: sum(1 for _, s in by_version.get(v, ()) if current(s)) for v in obs.target}
    missing = [v for v in obs.target if serving[v] < len(readable) or not readable]
    stale_config = [v for v in missing if any(s.state == "READY" and not current(s) for _, s in by_version.get(v, ()))]
    failed_loads = [(r, s) for v in obs.target for r, s in by_version.get(v, ()) if _failed(s)]

    conds: list[Condition] = []
    last_failure = previous.get("lastFailure")

    def failure(reason: str, message: str, version: int | None) -> dict[str, Any]:
        """Keep the previous record (and its time) while the same failure persists: no write per resync."""
        record: dict[str, Any] = {"reason": reason, "message": message, "time": stamp}
        if version is not None:
            record["version"] = version
        if last_failure and {k: v for k, v in last_failure.items() if k != "time"} == {
            k: v for k, v in record.items() if k != "time"
        }:
            return dict(last_failure)
        return record

    if obs.render_error:
        reason, message = obs.render_error
        conds.append(Condition("Rendered", False, reason, message))
        if reason not in WAITING:  # a download waiting for a slot has not failed
            last_failure = failure(reason, message, obs.failed_version)
    else:
        conds.append(Condition("Rendered", True, "RepositoryUpToDate", f"versions {obs.rendered} in the repository"))
    load_message = ""
    if failed_loads:
        r, s = failed_loads[-1]
        where = f" on replica {r.name}" if multi else ""
        load_message = f"version {s.version} failed to load{where}: {s.reason}"
        if not obs.render_error:
            last_failure = failure("LoadFailed", load_message, s.version)
    server = f"InferenceServer '{obs.server}'" if obs.server else "the server"
    if obs.render_error:
        ready = Condition("Ready", False, obs.render_error[0], obs.render_error[1])
    elif not obs.replicas:
        ready = Condition("Ready", False, "ServerUnavailable", obs.index_error or f"{server} has no running replicas")
    elif failed_loads:
        ready = Condition("Ready", False, "LoadFailed", load_message)
    elif not readable:
        errors = "; ".join(f"{r.name}: {r.error}" if multi else r.error for r in unreadable)
        ready = Condition("Ready", False, "ServerUnreachable", obs.index_error or errors)
    elif missing:
        if stale_config:
            text = f"waiting for the server to load the new config of versions {stale_config}"
        else:
            text = f"waiting for versions {missing} to be READY on the server"
        if multi:
            counts = ", ".join(f"version {v} on {serving[v]} of {len(readable)}" for v in missing)
            text += f" (serving {counts} replicas)"
        ready = Condition("Ready", False, "Loading", text)
    elif unreadable:
        names = ", ".join(r.name for r in unreadable)
        ready = Condition(
            "Ready",
            False,
            "ServerUnreachable",
            f"cannot read the repository index of replicas {names}: {unreadable[0].error}",
        )
    elif not any_ready:
        ready = Condition("Ready", False, "ServerNotReady", f"no replica of {server} is ready to take requests")
    else:
        on = f" on {_plural(len(readable), 'replica')}" if multi else ""
        loaded = sum(1 for r in readable if any(s.state == "READY" for s in r.states or ()))
        lazily = any(s.state == ON_DEMAND for r in readable for s in r.states or ())
        demand = f" (loaded on demand: now on {loaded} of {_plural(len(readable), 'replica')})" if lazily else ""
        ready = Condition("Ready", True, "Serving", f"versions {active} are READY{on}{demand}")
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
    states = []
    for v in sorted(by_version):
        seen = by_version[v]
        worst = min(seen, key=lambda rs: _STATE_ORDER.get(rs[1].state, -1))[1]
        count = serving[v] if v in serving else sum(1 for _, s in seen if s.state in ("READY", ON_DEMAND))
        states.append(
            VersionStateStatus(
                version=v, state=worst.state, reason=worst.reason, replicas=len(readable), ready_replicas=count
            )
        )
    # the compact forms ``kubectl get im`` prints: which versions serve, and on how many of the replicas found
    target = set(obs.target)
    full = sum(1 for here in current_versions if target <= here) if target else 0
    typed = InferenceModelStatus(
        observed_generation=obs.generation,
        conditions=tuple(conditions(conds, previous.get("conditions"), obs.generation, stamp)),
        target_versions=tuple(obs.target),
        active_versions=tuple(active),
        active_version=active[-1] if active else None,
        rendered_versions=tuple(obs.rendered),
        version_states=tuple(states),
        serving_versions=",".join(map(str, active)) or None,
        serving_replicas=f"{full}/{len(obs.replicas)}",
        last_failure=_last_failure(last_failure),
        endpoint=_endpoint(obs.endpoint),
        repository_path=obs.repository_path or previous.get("repositoryPath"),
    )
    status = as_body(typed, nulls=True)
    for key in WRITTEN_ELSEWHERE:
        del status[key]
    return status


def _last_failure(record: Mapping[str, Any] | None) -> LastFailure | None:
    if record is None:
        return None
    get = record.get
    return LastFailure(version=get("version"), reason=get("reason"), message=get("message"), time=get("time"))


def _endpoint(endpoint: Mapping[str, str] | None) -> ModelEndpoint | None:
    if endpoint is None:
        return None
    return ModelEndpoint(http=endpoint.get("http"), grpc=endpoint.get("grpc"), model=endpoint.get("model"))


def _same(stored: Any, new: Any) -> bool:
    """Whether merge-patching ``new`` over ``stored`` leaves it as it is: a key whose value is None counts as
    absent (the API stores no None), compared in place without building pruned copies (a bulk create compares
    one status per model)."""
    if isinstance(new, Mapping) and isinstance(stored, Mapping):
        return all(_same(stored.get(k), v) for k, v in new.items()) and all(
            k in new or v is None for k, v in stored.items()
        )
    if isinstance(new, list) and isinstance(stored, list):
        return len(stored) == len(new) and all(_same(a, b) for a, b in zip(stored, new, strict=True))
    return bool(stored == new)


def status_changed(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` would change the stored status (a resync that changed nothing writes nothing).
    A top-level key ``new`` leaves out stays as stored (a merge patch), one it sets to None is removed."""
    stored = previous or {}
    return not all(_same(stored.get(k), v) for k, v in new.items())
