"""The InferenceModel status as typed classes: each field's JSON name and description in one place.
``model_crd`` generates the CRD's status schema from them (``typed.schema_of``), and ``status.model_status``
builds the status it writes as an ``InferenceModelStatus`` (``typed.as_body``). The parts later steps of a
reconcile add (``traffic.rollout``'s ``versionTraffic``/``rollout``, ``models.cold_start``'s ``coldStart``) are
still merged in as documents under these names. The classes are not frozen: a frozen ``__init__`` costs about
four times as much, on a path every reconcile of every model takes.

The conditions' schema is the one both CRDs share (``CONDITIONS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from . import CONDITIONS
from .typed import resolve, spec_field

_INTS_ORDER = ("type", "items")


def _int64(json: str, description: str) -> Any:
    return spec_field(json, description, default=None, format="int64")


def _count(json: str, description: str) -> Any:
    """An integer the CRD states without a format."""
    return spec_field(json, default=None, schema={"type": "integer", "description": description})


def _time(json: str, description: str) -> Any:
    return spec_field(json, description, default=None, format="date-time")


def _number(json: str, description: str) -> Any:
    return spec_field(json, description, default=None)


def _text(json: str, description: str) -> Any:
    return spec_field(json, description, default=None)


def _versions(json: str, description: str) -> Any:
    return spec_field(json, description, default=None, items={"format": "int64"}, key_order=_INTS_ORDER)


@dataclass(kw_only=True)
class VersionStateStatus:
    version: int | None = _int64("version", "Version number.")
    state: str | None = _text(
        "state",
        "READY, LOADING, UNLOADING or UNAVAILABLE (as the servers report it; "
        "when replicas differ, the state furthest from READY), or ON_DEMAND (a server with "
        "spec.modelCache loads it on its next request).",
    )
    reason: str | None = _text("reason", "Why the version is not READY, if it is not.")
    replicas: int | None = _count("replicas", "Server replicas whose repository index was read.")
    ready_replicas: int | None = _count(
        "readyReplicas", "Of those, replicas serving this version (from the rendered config)."
    )


@dataclass(kw_only=True)
class LastFailure:
    version: int | None = _int64("version", "Version concerned, if any.")
    reason: str | None = _text("reason", "CamelCase reason.")
    message: str | None = _text("message", "What went wrong and what to fix.")
    time: str | None = _time("time", "When it happened.")


@dataclass(kw_only=True)
class VersionTraffic:
    version: int | None = _int64("version", "Version number.")
    traffic_percent: float | None = _number("trafficPercent", "Weight in force (after a rollout decision).")
    requests: int | None = _int64(
        "requests", "Requests the weights routed here in the window (not those naming the version)."
    )
    failures: int | None = _int64("failures", "Failed requests in the window.")
    error_rate: float | None = _number("errorRate", "failures / requests (0 without requests).")
    p99_milliseconds: float | None = _number("p99Milliseconds", "p99 latency in the window (histogram).")
    window_seconds: int | None = _count("windowSeconds", "Seconds the numbers cover (up to the window).")


@dataclass(kw_only=True)
class Weight:
    version: int | None = _int64("version", "Version number.")
    traffic_percent: float | None = _number("trafficPercent", "Its weight in force.")


@dataclass(kw_only=True)
class RolloutStatus:
    phase: str | None = _text("phase", "Progressing, Promoted or RolledBack.")
    canary_version: int | None = _int64("canaryVersion", "The version judged.")
    generation: int | None = _int64("generation", "The generation judged.")
    message: str | None = _text("message", "Why, with the numbers.")
    time: str | None = _time("time", "When the phase was entered.")
    weights: tuple[Weight, ...] | None = spec_field(
        "weights", "The weights a decision put in force (Promoted, RolledBack).", default=None
    )


@dataclass(kw_only=True)
class ArtifactFetch:
    version: int | None = _int64("version", "Version.")
    bytes: int | None = _int64("bytes", "Bytes fetched.")
    seconds: float | None = _number("seconds", "Seconds the fetch took.")
    pinned_by: str | None = _text(
        "pinnedBy",
        "What pinned the content an s3://, gs://, oci:// or hf:// store served: "
        "'oci-digest sha256:<manifest digest>', 'hf-commit <commit>', 'gcs-generation <n>', "
        "'s3-checksum sha256:<hex>', "
        "'s3-version <id>', 'sha256 sha256:<hex>', or a count for a folder.",
    )


@dataclass(kw_only=True)
class RenderTiming:
    time: str | None = _time("time", "When it was published on the volume.")
    fetch_seconds: float | None = _number(
        "fetchSeconds", "Seconds spent fetching its artifacts (downloads or volume copies)."
    )
    fetched_bytes: int | None = _int64("fetchedBytes", "Bytes fetched.")
    render_seconds: float | None = _number(
        "renderSeconds", "Seconds of the rest of the sync: checks, staging, publishing."
    )
    artifacts: tuple[ArtifactFetch, ...] | None = spec_field("artifacts", "Each artifact fetched.", default=None)


@dataclass(kw_only=True)
class ReplicaColdStart:
    replica: str | None = _text("replica", "Pod name.")
    version: int | None = _int64("version", "Version.")
    load_started: str | None = _time("loadStarted", "When the replica began loading the version.")
    load_seconds: float | None = _number(
        "loadSeconds", "Seconds from reading the model's folder to every instance loaded."
    )
    warmup_seconds: float | None = _number("warmupSeconds", "Seconds its warm-up samples took.")
    ready_time: str | None = _time("readyTime", "When it was READY.")
    first_inference_time: str | None = _time("firstInferenceTime", "When its first successful inference was answered.")
    first_inference_seconds: float | None = _number(
        "firstInferenceSeconds", "Seconds that first successful inference took."
    )


@dataclass(kw_only=True)
class ColdStart:
    render: RenderTiming | None = spec_field("render", "The last render that changed the model's folder.", default=None)
    replicas: tuple[ReplicaColdStart, ...] | None = spec_field(
        "replicas", "Per server replica and serving version, as the replica measured it.", default=None
    )


@dataclass(kw_only=True)
class ModelEndpoint:
    http: str | None = _text("http", "host:port of the server's HTTP/REST endpoint.")
    grpc: str | None = _text("grpc", "host:port of the server's gRPC endpoint.")
    model: str | None = _text("model", "Model name to use in requests.")


@dataclass(kw_only=True)
class InferenceModelStatus:
    DESCRIPTION: ClassVar[str] = "Observed state of the model, from the repository and the server's repository index."

    observed_generation: int | None = _int64("observedGeneration", "metadata.generation last reconciled.")
    conditions: tuple[Mapping[str, Any], ...] = spec_field("conditions", schema=CONDITIONS, default=())
    target_versions: tuple[int, ...] | None = _versions(
        "targetVersions", "Versions the version policy selects from spec.versions."
    )
    active_versions: tuple[int, ...] | None = _versions(
        "activeVersions", "Versions READY on at least one server replica."
    )
    active_version: int | None = _int64("activeVersion", "Highest READY version.")
    rendered_versions: tuple[int, ...] | None = _versions(
        "renderedVersions", "Version folders present in the repository."
    )
    serving_versions: str | None = _text(
        "servingVersions", "activeVersions comma-separated, e.g. 1,2 (the Versions column of kubectl get)."
    )
    serving_replicas: str | None = _text(
        "servingReplicas",
        "Replicas serving every target version / server replicas found, e.g. 2/3 (the Replicas column of kubectl get).",
    )
    version_states: tuple[VersionStateStatus, ...] | None = spec_field(
        "versionStates", "Per-version state from the server's repository index.", default=None
    )
    last_failure: LastFailure | None = spec_field(
        "lastFailure", "The most recent failure (render, fetch or load).", default=None
    )
    version_traffic: tuple[VersionTraffic, ...] | None = spec_field(
        "versionTraffic",
        "Per weighted version: the weight in force and its numbers over the rollout window, "
        "summed over the ready replicas.",
        default=None,
    )
    rollout: RolloutStatus | None = spec_field("rollout", "The rollout rule's state (spec.rollout).", default=None)
    cold_start: ColdStart | None = spec_field(
        "coldStart",
        "How long the model took to become servable, phase by phase (operator/models/cold_start.py).",
        default=None,
    )
    repository_path: str | None = _text(
        "repositoryPath", "Folder of the model inside the repository volume (<server subPath>/<model>)."
    )
    endpoint: ModelEndpoint | None = spec_field("endpoint", "Where to send requests for this model.", default=None)


resolve(InferenceModelStatus)
