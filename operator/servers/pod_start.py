"""How each pod of an InferenceServer started, phase by phase, for its status. Pure functions.

created → scheduled (the ``PodScheduled`` condition) → container started (the server container's
``state.running.startedAt``: its image is on the node by then) → server listening → all start-up models
Ready. The last two come from the server itself (``GET /v2/kubeinfer/startup``: the process knows when it
bound its ports and when its start-up loads finished), the others from the pod's status. A timeline that is
complete never changes, so the reconciler reads each pod's server once it is (``complete``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

from ..api.server_spec import POD_START_PHASES as PHASES


def _epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def _stamp(epoch: float) -> str:
    moment = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pod_timeline(
    pod: Mapping[str, Any], startup: Mapping[str, Any] | None, container: str = "server"
) -> dict[str, Any]:
    """One entry of ``status.pods``: each phase's time (RFC 3339) and the seconds each took after the one
    before (``seconds``), for the phases known so far."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    scheduled: Mapping[str, Any] = next(
        (c for c in st.get("conditions") or () if c.get("type") == "PodScheduled" and c.get("status") == "True"), {}
    )
    running: Mapping[str, Any] = next(
        (
            ((c.get("state") or {}).get("running") or {})
            for c in st.get("containerStatuses") or ()
            if c.get("name") == container
        ),
        {},
    )
    startup = startup or {}
    times = {
        "created": _epoch(meta.get("creationTimestamp")),
        "scheduled": _epoch(scheduled.get("lastTransitionTime")),
        "containerStarted": _epoch(running.get("startedAt")),
        "listening": _number(startup.get("listening_at")),
        "modelsReady": _number(startup.get("models_ready_at")),
    }
    entry: dict[str, Any] = {"name": meta.get("name", "")}
    seconds: dict[str, float] = {}
    last: float | None = None
    for phase, _ in PHASES:
        at = times[phase]
        if at is None:
            continue
        entry[phase] = _stamp(at)
        if last is not None:
            # pod times have whole seconds, the server's milliseconds: a phase never shows negative
            seconds[phase] = round(max(0.0, at - last), 3)
        last = at
    if seconds:
        entry["seconds"] = seconds
    return entry


def complete(entry: Mapping[str, Any]) -> bool:
    """Every phase is known: nothing about this pod's start changes any more."""
    return all(phase in entry for phase, _ in PHASES)
