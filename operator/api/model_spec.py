"""The InferenceModel spec's typed parts and the facts its CRD states: a version's source, the rollout rule's
schema and defaults. The feature modules (``models.render``, ``traffic.rollout``) read these; the CRD
(``model_crd``) publishes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: spec.rollout.windowSeconds when unset
ROLLOUT_WINDOW_SECONDS = 60
#: spec.rollout.minRequests when unset
ROLLOUT_MIN_REQUESTS = 100


@dataclass(frozen=True)
class Source:
    uri: str | None = None
    path: str | None = None
    sha256: str | None = None
    #: name of a Secret (the model's namespace) with download credentials for ``uri``
    credentials_secret: str | None = None
    #: s3://, gs://, oci://, hf:// and az://: the store's base URL when not the default, the S3 region and
    #: addressing style
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None

    @classmethod
    def from_spec(cls, data: Mapping[str, Any] | None) -> Source:
        data = data or {}
        return cls(
            uri=data.get("uri"),
            path=data.get("path"),
            sha256=data.get("sha256"),
            credentials_secret=data.get("credentialsSecret"),
            endpoint=data.get("endpoint"),
            region=data.get("region"),
            path_style=data.get("pathStyle"),
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: v
            for k, v in (
                ("uri", self.uri),
                ("path", self.path),
                ("sha256", self.sha256),
                ("credentialsSecret", self.credentials_secret),
                ("endpoint", self.endpoint),
                ("region", self.region),
            )
            if v
        }
        if self.path_style is not None:
            out["pathStyle"] = self.path_style
        return out


ROLLOUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Promote or roll back the canary (the highest version with a trafficPercent under 100) by "
    "its numbers over a window, read from the servers' statistics.",
    "properties": {
        "windowSeconds": {
            "type": "integer",
            "format": "int32",
            "minimum": 10,
            "maximum": 3600,
            "description": f"The window the numbers are taken over (default {ROLLOUT_WINDOW_SECONDS}).",
        },
        "minRequests": {
            "type": "integer",
            "format": "int32",
            "minimum": 1,
            "description": f"Canary requests in the window before any decision (default {ROLLOUT_MIN_REQUESTS}).",
        },
        "maxErrorRate": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "description": "Failed / all canary requests in the window above which it is rolled back.",
        },
        "maxP99Milliseconds": {
            "type": "number",
            "minimum": 0,
            "description": "Canary p99 latency (inside the server) in the window above which it is rolled back.",
        },
        "promote": {
            "type": "boolean",
            "description": "Give the canary 100 percent after a full window within the limits (default true).",
        },
    },
}

TRAFFIC_PERCENT_SCHEMA: dict[str, Any] = {
    "type": "integer",
    "format": "int32",
    "minimum": 0,
    "maximum": 100,
    "description": "Percent of the requests that name no version sent to this version (among the weighted "
    "versions that are ready). When any version has one, they must add up to 100.",
}

TRAFFIC_RULE = {
    "rule": "!self.versions.exists(v, has(v.trafficPercent)) || "
    "self.versions.filter(v, has(v.trafficPercent)).map(v, v.trafficPercent).sum() == 100",
    "message": "spec.versions[].trafficPercent must add up to 100",
}

ROLLOUT_STATUS_SCHEMA: dict[str, Any] = {
    "versionTraffic": {
        "type": "array",
        "description": "Per weighted version: the weight in force and its numbers over the rollout window, "
        "summed over the ready replicas.",
        "items": {
            "type": "object",
            "properties": {
                "version": {"type": "integer", "format": "int64", "description": "Version number."},
                "trafficPercent": {"type": "number", "description": "Weight in force (after a rollout decision)."},
                "requests": {
                    "type": "integer",
                    "format": "int64",
                    "description": "Requests the weights routed here in the window (not those naming the version).",
                },
                "failures": {"type": "integer", "format": "int64", "description": "Failed requests in the window."},
                "errorRate": {"type": "number", "description": "failures / requests (0 without requests)."},
                "p99Milliseconds": {"type": "number", "description": "p99 latency in the window (histogram)."},
                "windowSeconds": {"type": "integer", "description": "Seconds the numbers cover (up to the window)."},
            },
        },
    },
    "rollout": {
        "type": "object",
        "description": "The rollout rule's state (spec.rollout).",
        "properties": {
            "phase": {"type": "string", "description": "Progressing, Promoted or RolledBack."},
            "canaryVersion": {"type": "integer", "format": "int64", "description": "The version judged."},
            "generation": {"type": "integer", "format": "int64", "description": "The generation judged."},
            "message": {"type": "string", "description": "Why, with the numbers."},
            "time": {"type": "string", "format": "date-time", "description": "When the phase was entered."},
            "weights": {
                "type": "array",
                "description": "The weights a decision put in force (Promoted, RolledBack).",
                "items": {
                    "type": "object",
                    "properties": {
                        "version": {"type": "integer", "format": "int64", "description": "Version number."},
                        "trafficPercent": {"type": "number", "description": "Its weight in force."},
                    },
                },
            },
        },
    },
}
