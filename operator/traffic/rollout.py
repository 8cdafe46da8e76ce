"""Canary between versions: ``versions[].trafficPercent``, the numbers per version, ``spec.rollout``.

``trafficPercent`` becomes the config parameter ``kubeinfer.version_traffic`` (``server/config/traffic.py``):
the pool's servers route requests that name no version by these weights, with no mesh in front. Without a
``versionPolicy`` the rendered policy loads exactly the weighted versions (the default, latest 1, would
leave a canary unloaded).

For a model with weights the operator reads each ready replica's statistics of this model (HTTP
``GET /v2/models/<m>/stats``, with the pool's token or TLS: ``server_access``), which carry per version the
success and failure counts and a latency histogram of the requests the weights routed there (the
``kubeinfer_routed`` field: a caller naming a version is outside the split and cannot steer the decision),
and keeps the growth between reads for a window (``RolloutWindow``, in the model's record: an operator restart
starts the window again, forgetting the model forgets it).
``status.versionTraffic`` shows per version the weight in force, routed requests, failures, error rate and
p99 over the window. Only models with weights pay for these reads (one small request per replica per
resync).

``spec.rollout`` decides by a rule over that window: the canary is the highest weighted version with
less than 100 percent; once it had ``minRequests`` in the window, an error rate above ``maxErrorRate`` or
a p99 above ``maxP99Milliseconds`` rolls it back (its weight to 0, the others scaled to 100), and a full
window within both promotes it (100, the others 0). The decision is kept in ``status.rollout`` for the
generation it was made for; the weights in force follow it until the spec changes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeinfer.server.config import ConfigError, pb
from kubeinfer.server.config.traffic import TRAFFIC_PARAMETER, render_traffic
from kubeinfer.server.config.version_policy import select_versions
from kubeinfer.server.vocabulary.statistics import LATENCY_KEY, ROUTED_KEY

from ..api.model_spec import ROLLOUT_WINDOW_SECONDS
from ..api.model_types import InferenceModel, InferenceModelSpec, Rollout
from ..api.status import Condition
from ..replicas.indexes import Endpoint, IndexReader
from ..replicas.replica_http import AnswerError
from ..replicas.server_access import PLAIN, ServerAccess

#: the window of ``status.versionTraffic`` without a ``spec.rollout``
DEFAULT_WINDOW = ROLLOUT_WINDOW_SECONDS
#: deltas older than this are dropped whatever the window (bounded memory per model)
KEEP_SECONDS = 3600.0
#: bytes one model's statistics answer may have (a few rows per version, a histogram each: a few KB)
STATS_MAX_BYTES = 1 << 20


def _decided(status: Mapping[str, Any] | None, generation: int) -> bool:
    """The status holds a rollout decision (Promoted, RolledBack) for ``generation``: final for it."""
    decision = (status or {}).get("rollout") or {}
    return bool(
        decision.get("generation") == generation
        and decision.get("phase") in ("Promoted", "RolledBack")
        and decision.get("weights")
    )


def weights_in_force(spec: InferenceModelSpec, status: Mapping[str, Any] | None, generation: int) -> dict[int, float]:
    """The spec's weights, or the ones a rollout decision for this generation put in force."""
    weights = spec.weights()
    if weights and spec.rollout is not None and _decided(status, generation):
        decision = (status or {})["rollout"]
        return {int(w["version"]): float(w["trafficPercent"]) for w in decision["weights"]}
    return weights


def decision_lost(known: Mapping[str, Any], incoming: Mapping[str, Any]) -> bool:
    """``incoming`` (a watch event) is older than the decision ``known`` carries: the same generation, decided
    in ``known``'s status and not in ``incoming``'s. A decision is final for its generation and only the
    operator writes the status, so such an event was written before the decision and arrived after it (the
    watch lags behind the operator's own writes); taken as the newest object, it would render the spec's
    weights again, a broken canary's traffic included, until the event of the decision's own write arrives."""
    generation = (incoming.get("metadata") or {}).get("generation", 0)
    return (
        (known.get("metadata") or {}).get("generation", 0) == generation
        and _decided(known.get("status"), generation)
        and not _decided(incoming.get("status"), generation)
    )


def apply_weights(config: pb.ModelConfig, weights: Mapping[int, float], versions: Iterable[int]) -> None:
    """Write ``weights`` into ``config`` (the traffic parameter; without a version policy, one that loads the
    weighted versions); ConfigError when they cannot be served as given."""
    if not weights:
        return
    total = sum(weights.values())
    if abs(total - 100) > 1e-6:
        raise ConfigError(f"spec.versions[].trafficPercent add up to {total:g}, not 100")
    if not config.HasField("version_policy"):
        config.version_policy.specific.versions.extend(sorted(weights))
    else:
        loaded = set(select_versions(config, versions))
        unloaded = sorted(v for v, w in weights.items() if w > 0 and v not in loaded)
        if unloaded:
            raise ConfigError(
                f"spec.versions[].trafficPercent sends traffic to versions {unloaded} that versionPolicy does not "
                "load: leave versionPolicy out (the weighted versions are loaded) or make it load them"
            )
    config.parameters[TRAFFIC_PARAMETER].string_value = render_traffic(weights)


# ---- numbers per version -------------------------------------------------------------------------------
@dataclass
class Numbers:
    """Counts of one version (cumulative as read, or a growth between reads)."""

    success: int = 0
    failure: int = 0
    bounds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def minus(self, before: Numbers) -> Numbers | None:
        """The growth since ``before``; None when a counter went down (the replica restarted)."""
        if self.success < before.success or self.failure < before.failure or len(self.counts) != len(before.counts):
            return None
        counts = [a - b for a, b in zip(self.counts, before.counts, strict=True)]
        if any(c < 0 for c in counts):
            return None
        return Numbers(self.success - before.success, self.failure - before.failure, self.bounds, counts)

    def plus(self, other: Numbers) -> Numbers:
        """The sum; a side without a histogram (a replica that has no latency series for the version yet: it
        served none of its requests) adds its counts only, never drops the other side's histogram."""
        if not self.counts:
            return Numbers(self.success + other.success, self.failure + other.failure, other.bounds, list(other.counts))
        if not other.counts:
            return Numbers(self.success + other.success, self.failure + other.failure, self.bounds, list(self.counts))
        counts = [a + b for a, b in zip(self.counts, other.counts, strict=False)]
        return Numbers(self.success + other.success, self.failure + other.failure, self.bounds, counts)

    @property
    def requests(self) -> int:
        return self.success + self.failure

    def quantile(self, q: float) -> float | None:
        """Latency quantile in µs, interpolated within its bucket as Prometheus' histogram_quantile does."""
        total = sum(self.counts)
        if not total or not self.bounds:
            return None
        rank = q * total
        seen = 0
        lower = 0.0
        for i, n in enumerate(self.counts):
            upper = self.bounds[i] if i < len(self.bounds) else None
            if seen + n >= rank and n:
                if upper is None:  # the +Inf bucket: the highest finite bound, as Prometheus answers
                    return float(self.bounds[-1])
                return lower + (upper - lower) * (rank - seen) / n
            seen += n
            lower = upper if upper is not None else lower
        return float(self.bounds[-1])


def numbers_from_stats(data: Mapping[str, Any]) -> dict[int, Numbers]:
    """Per version, from a ``GET /v2/models/<m>/stats`` answer: only the requests the traffic weights sent to
    it (the row's ``ROUTED_KEY``). Triton's counts in the row also hold callers that name the version, who
    are outside the weighted split: a burst of failing or fast requests to ``/versions/<v>/infer`` would
    roll a healthy canary back or promote a slow one. A row without the field (no routed request yet, or a
    server from before it) counts none."""
    out: dict[int, Numbers] = {}
    for row in data.get("model_stats") or ():
        try:
            version = int(row.get("version") or 0)
        except ValueError:
            continue
        stats = row.get(ROUTED_KEY) or {}
        latency = stats.get(LATENCY_KEY) or {}
        out[version] = Numbers(
            int((stats.get("success") or {}).get("count") or 0),
            int((stats.get("fail") or {}).get("count") or 0),
            [float(b) for b in latency.get("bounds_us") or ()],
            [int(c) for c in latency.get("counts") or ()],
        )
    return out


class StatsReader:
    """Reads one model's statistics from each ready replica with the index reader's HTTP clients."""

    def __init__(self, reader: IndexReader) -> None:
        self.reader = reader
        self.requests = 0

    def read(
        self, endpoints: Iterable[Endpoint], model: str, access: ServerAccess = PLAIN
    ) -> dict[str, dict[int, Numbers]]:
        """Replica name → numbers per version; replicas that cannot be read (or have not loaded the model:
        400 'not available') are left out."""
        out: dict[str, dict[int, Numbers]] = {}
        for endpoint in endpoints:
            if not endpoint.ready:
                continue
            url = access.url(endpoint.url)
            try:
                self.requests += 1
                answer = self.reader.client_for(access).exchange(
                    "GET",
                    f"{url}/v2/models/{model}/stats",
                    headers=access.headers,
                    max_bytes=STATS_MAX_BYTES,
                    deadline=self.reader.deadline,
                )
                data = answer.json() if answer.status == 200 else None
                if isinstance(data, dict):
                    out[endpoint.name] = numbers_from_stats(data)
            except (AnswerError, ValueError, TypeError, AttributeError):  # unreadable, or not the answer's shape
                continue
        return out


class RolloutWindow:
    """One model's numbers: the growth between reads, per replica, kept for the window, and the generation
    they judge. Held in the model's record (``controllers.model_record``) and used under the model's lock, so
    a model forgotten is its window forgotten."""

    def __init__(self) -> None:
        #: replica -> the numbers per version it answered last
        self._last: dict[str, dict[int, Numbers]] = {}
        self._deltas: collections.deque[tuple[float, dict[int, Numbers]]] = collections.deque()
        #: when the first read of this generation was taken (None: none yet)
        self._since: float | None = None
        #: the generation the numbers judge
        self.generation: int | None = None

    def observe(self, replicas: Mapping[str, Mapping[int, Numbers]], now: float) -> None:
        """One read of every replica. The first read of a model is the baseline (what its replicas counted
        before is not in any window); a replica first read later joined since (a new pod, one that just
        became ready or loaded the model): everything it counted is new."""
        delta: dict[int, Numbers] = {}
        first = self._since is None
        for replica, versions in replicas.items():
            before = self._last.get(replica)
            self._last[replica] = dict(versions)
            if before is None:
                if first:
                    continue
                before = {}
            for v, numbers in versions.items():
                grown = numbers.minus(before[v]) if v in before else numbers
                grown = grown if grown is not None else numbers  # restarted: all it counted is new
                delta[v] = delta[v].plus(grown) if v in delta else grown
        if self._since is None:
            self._since = now
        self._deltas.append((now, delta))
        while self._deltas and self._deltas[0][0] < now - KEEP_SECONDS:
            self._deltas.popleft()

    def window(self, seconds: float, now: float) -> tuple[dict[int, Numbers], float]:
        """Numbers per version over the last ``seconds``, and how many seconds of reads they cover."""
        total: dict[int, Numbers] = {}
        for at, delta in self._deltas:
            if at < now - seconds:
                continue
            for v, numbers in delta.items():
                total[v] = total[v].plus(numbers) if v in total else numbers
        covered = min(seconds, now - (now if self._since is None else self._since))
        return total, covered

    def restart(self, generation: int, now: float) -> None:
        """A new generation is judged from now on (the replicas' last answers stay: the baseline of growth)."""
        self.generation = generation
        self._deltas.clear()
        self._since = now

    def clear(self) -> None:
        """The model has no weights (any more): nothing is kept."""
        self._last.clear()
        self._deltas.clear()
        self._since = None
        self.generation = None


# ---- the status and the rule ---------------------------------------------------------------------------
def canary_of(weights: Mapping[int, float]) -> int | None:
    """The version under test: the highest weighted one below 100 percent, when two or more are weighted."""
    if len(weights) < 2:
        return None
    candidates = [v for v, w in weights.items() if 0 < w < 100]
    return max(candidates) if candidates else None


def version_traffic(
    weights: Mapping[int, float], window: Mapping[int, Numbers], covered: float
) -> list[dict[str, Any]]:
    rows = []
    for v in sorted(weights):
        n = window.get(v, Numbers())
        p99 = n.quantile(0.99)
        rows.append(
            {
                "version": v,
                "trafficPercent": weights[v],
                "requests": n.requests,
                "failures": n.failure,
                "errorRate": round(n.failure / n.requests, 4) if n.requests else 0.0,
                "p99Milliseconds": round(p99 / 1000, 3) if p99 is not None else None,
                "windowSeconds": int(covered),
            }
        )
    return rows


def judge(
    rule: Rollout, canary: int, weights: Mapping[int, float], window: Mapping[int, Numbers], covered: float
) -> tuple[str, str, dict[int, float]]:
    """(phase, message, weights to put in force) for the canary's numbers."""
    n = window.get(canary, Numbers())
    if n.requests < rule.min_requests:
        return (
            "Progressing",
            f"version {canary} had {n.requests} of the {rule.min_requests} requests needed in the last {int(covered)}s",
            dict(weights),
        )
    rate = n.failure / n.requests
    p99 = n.quantile(0.99)
    p99_ms = p99 / 1000 if p99 is not None else None
    numbers = (
        f"error rate {rate:.4f}, p99 {p99_ms:.1f} ms over {n.requests} requests in the last {int(covered)}s"
        if p99_ms is not None
        else f"error rate {rate:.4f} over {n.requests} requests in the last {int(covered)}s"
    )
    broken = []
    if rule.max_error_rate is not None and rate > rule.max_error_rate:
        broken.append(f"error rate above {rule.max_error_rate:g}")
    if rule.max_p99_milliseconds is not None and p99_ms is not None and p99_ms > rule.max_p99_milliseconds:
        broken.append(f"p99 above {rule.max_p99_milliseconds:g} ms")
    if broken:
        others = {v: w for v, w in weights.items() if v != canary}
        rest = sum(others.values())
        back = {v: (100 * w / rest if rest else 100 / len(others)) for v, w in others.items()}
        return "RolledBack", f"version {canary} rolled back ({', '.join(broken)}): {numbers}", {**back, canary: 0.0}
    if rule.promote and covered >= rule.window_seconds:
        promoted = {v: 0.0 for v in weights} | {canary: 100.0}
        return "Promoted", f"version {canary} promoted after a full window within the limits: {numbers}", promoted
    return "Progressing", f"version {canary} within the limits so far: {numbers}", dict(weights)


class Rollouts:
    """What a model reconcile adds for weights and spec.rollout (numbers, status, decisions); what it keeps
    per model is the model's ``RolloutWindow``."""

    def __init__(self, reader: IndexReader, now: Any = time.monotonic) -> None:
        self.stats = StatsReader(reader)
        self._now = now

    def extend(
        self,
        window: RolloutWindow,
        model: InferenceModel,
        new: dict[str, Any],
        endpoints: Iterable[Endpoint],
        access: ServerAccess | str,
        stamp: str,
    ) -> tuple[list[Condition], str | None]:
        """Add ``versionTraffic`` and ``rollout`` to ``new``; returns extra conditions and the message of a
        decision made now (None: none), after which the model is rendered again with the new weights."""
        spec, generation, prev = model.spec, model.generation, model.status
        weights = spec.weights()
        if not weights:
            window.clear()
            new["versionTraffic"] = None
            new["rollout"] = None
            return [], None
        now = self._now()
        if window.generation != generation:
            window.restart(generation, now)
        if not isinstance(access, str):
            window.observe(self.stats.read(endpoints, model.name, access), now)
        rule = spec.rollout
        numbers, covered = window.window(rule.window_seconds if rule else DEFAULT_WINDOW, now)
        in_force = weights_in_force(spec, prev, generation)
        new["versionTraffic"] = version_traffic(in_force, numbers, covered)
        if rule is None:
            new["rollout"] = None
            return [], None
        before = prev.get("rollout") or {}
        canary = canary_of(weights)
        if before.get("generation") == generation and before.get("phase") in ("Promoted", "RolledBack"):
            new["rollout"] = dict(before)
            return [_condition(before)], None
        if canary is None:
            state = {
                "phase": "Progressing",
                "generation": generation,
                "message": "no canary: fewer than two versions with traffic, or one with all of it",
            }
            new["rollout"] = _keep_time(before, state, stamp)
            return [_condition(state)], None
        phase, message, decided = judge(rule, canary, weights, numbers, covered)
        state = {"phase": phase, "canaryVersion": canary, "generation": generation, "message": message}
        if phase != "Progressing":
            state["weights"] = [{"version": v, "trafficPercent": round(w, 3)} for v, w in sorted(decided.items())]
        new["rollout"] = _keep_time(before, state, stamp)
        return [_condition(state)], (message if phase != "Progressing" else None)


def _keep_time(before: Mapping[str, Any], state: dict[str, Any], stamp: str) -> dict[str, Any]:
    """Keep ``time`` while the phase and generation stay (no status write per resync for the time)."""
    same = before.get("phase") == state["phase"] and before.get("generation") == state["generation"]
    state["time"] = before.get("time") if same and before.get("time") else stamp
    return state


def _condition(state: Mapping[str, Any]) -> Condition:
    """``Canary``: False only once rolled back."""
    return Condition("Canary", state.get("phase") != "RolledBack", str(state.get("phase")), str(state.get("message")))
