"""The InferenceModel spec as typed classes: the operator's fields (``server``, ``versions`` and their sources,
``rollout``, ``coldStartBudgetSeconds``) with each one's JSON name, description, bounds, CEL rules and default in
one place. ``model_crd`` generates the CRD's spec schema from them (``typed.schema_of``) and splices in the
ModelConfig part, which is generated from ``model_config.proto`` (``schema``): the spec's other keys, kept as
they are written (``InferenceModel.config``) for ``render.spec_to_config``.

``InferenceModel.from_body`` reads a custom object once per reconcile: its identity, the typed spec, the
ModelConfig part and the status it carries; the controller hands that to the feature modules (render,
rollout, cold start, sequence routing), which read attributes, not dict keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kubeinfer.server.sources.uris import AZURE_BLOB_URL_PATTERN

from . import model_spec
from .schema import MAX_VERSIONS
from .typed import api_field, as_body, parse, resolve, spec_field

#: where a string field's bounds go in the CRD (before its description)
_STRING_ORDER = ("type", "minLength", "maxLength", "pattern")


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where one version's model file (or folder) comes from: a store's URI or a path on the volume."""

    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {"rule": "has(self.uri) != has(self.path)", "message": "give exactly one of source.uri or source.path"},
        {
            "rule": "!has(self.uri) || !self.uri.matches('^https?://') || has(self.sha256) || "
            f"self.uri.matches(r'{AZURE_BLOB_URL_PATTERN}')",
            "message": "an http(s) source.uri needs source.sha256 (hex SHA-256), unless it is an Azure Blob URL "
            "(https://<account>.blob.core.windows.net/<container>/<path>)",
        },
        {
            "rule": "!has(self.credentialsSecret) || (has(self.uri) && !self.uri.startsWith('http://'))",
            "message": "source.credentialsSecret needs an https://, s3://, gs://, oci://, hf:// or az:// source.uri "
            "(credentials are never sent in clear)",
        },
        {
            "rule": "!has(self.endpoint) && !has(self.region) && !has(self.pathStyle) || "
            "(has(self.uri) && self.uri.matches('^(s3|gs|oci|hf|az)://'))",
            "message": "source.endpoint, region and pathStyle are for s3://, gs://, oci://, hf:// and az:// sources",
        },
        {
            "rule": "!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)[.][.](/|$)'))",
            "message": "source.path must be relative to the repository volume and must not contain '..'",
        },
    )

    uri: str | None = spec_field(
        "uri",
        "Where the store keeps the model: https://host/file (with sha256), s3://bucket/key, "
        "s3://bucket/prefix/ (every object under it), s3://host:port/bucket/key (Triton's form for a local S3 "
        "store, over http), gs://bucket/object, gs://bucket/prefix/ (Cloud Storage), "
        "oci://registry/repository:tag or @sha256:<digest>, hf://org/repo[@revision]/path "
        "(a file, a folder/ or, with no path, the whole repository of a Hugging Face Hub model; the revision, "
        "main by default, is resolved to a commit). Downloaded through the egress rules, size-limited, and "
        "checked against what pins it: sha256, the S3 object's SHA-256 checksum or version, the Cloud Storage "
        "object's generation, the OCI digests, "
        "the Hub's commit and each LFS file's sha256, the Azure blob's version id. az://account/container/blob or "
        "az://account/container/prefix/ (Azure Blob Storage; "
        "https://account.blob.core.windows.net/container/path is read the same way, as KServe does, unless it "
        "carries a query such as a SAS: then it is a plain https download, with sha256).",
        default=None,
        maxLength=2048,
        pattern=model_spec.SOURCE_URI_PATTERN,
        key_order=_STRING_ORDER,
    )
    #: s3://, gs://, oci://, hf:// and az://: the store's base URL when not the default
    endpoint: str | None = spec_field(
        "endpoint",
        "The store's base URL when it is not the default: an S3-compatible store "
        "(https://minio.example.com:9000; path-style addressing unless pathStyle is false), a registry "
        "reached over plain http (http://registry.local:5000, never with credentials), a Cloud Storage endpoint "
        "other than https://storage.googleapis.com (never with credentials over http), or a Hugging Face Hub "
        "other than https://huggingface.co (a mirror or a private Hub), or an Azure Blob endpoint other than "
        "https://<account>.blob.core.windows.net (only az:// takes a path: the account, path-style as Azurite "
        "serves, http://127.0.0.1:10000/devstoreaccount1). Checked by the egress rules like any URL.",
        default=None,
        maxLength=512,
        pattern="^https?://[^/?#]+(/[a-z0-9]{3,24})?/?$",
        key_order=_STRING_ORDER,
    )
    region: str | None = spec_field(
        "region",
        "The S3 region (default us-east-1): signs the requests, and picks AWS's endpoint.",
        default=None,
        maxLength=64,
        pattern="^[a-z0-9-]+$",
        key_order=_STRING_ORDER,
    )
    path_style: bool | None = spec_field(
        "pathStyle",
        "S3 path-style addressing (endpoint/bucket/key) instead of virtual-hosted "
        "(bucket.endpoint/key). Default: true with an endpoint, false for AWS.",
        default=None,
    )
    sha256: str | None = spec_field(
        "sha256",
        "Lower-case hex SHA-256 of the file; required with an http(s) uri, and with an s3 object "
        "that has neither a SHA-256 checksum nor a version id (a gs object's generation pins it without one); "
        "verified for path when given. Not for folders "
        "(each object is pinned by the store).",
        default=None,
        pattern="^[0-9a-f]{64}$",
        key_order=_STRING_ORDER,
    )
    #: name of a Secret (the model's namespace) with download credentials for ``uri``
    credentials_secret: str | None = spec_field(
        "credentialsSecret",
        "Secret in the model's namespace with download credentials for uri: for https and oci "
        "the keys token (Bearer), username and password (Basic), or authorization (the header's value); for "
        "hf the key token (a Hub access token, for private and gated models; never sent over http); for "
        "s3 AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optionally AWS_SESSION_TOKEN (requests are signed, "
        "the secret key is never sent); for gs a service-account key's JSON under key.json (its read-only "
        "access token goes to the endpoint, the signed grant to the key's token_uri through the egress rules); "
        "for az AZURE_STORAGE_SAS_TOKEN (or sasToken; read and list permissions) or AZURE_STORAGE_KEY (or "
        "accountKey: it signs a short-lived read-only SAS here and is never sent). "
        "The Secret "
        "must be labelled serving.kubeinfer.io/artifact-credentials=true and name the hosts it may be sent to "
        "in the annotation serving.kubeinfer.io/artifact-hosts (comma-separated; '*.example.com' matches "
        "names below it). Sent only to the uri's own host, and only when that host is listed.",
        default=None,
        maxLength=253,
        pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        key_order=_STRING_ORDER,
    )
    path: str | None = spec_field(
        "path",
        "File path relative to this namespace's folder on the repository volume "
        "(<volume>/<namespace>/, e.g. uploads/model.onnx). Must stay inside that folder and must not pass "
        "through a symlink.",
        default=None,
        minLength=1,
        maxLength=1024,
        key_order=_STRING_ORDER,
    )

    @classmethod
    def from_spec(cls, data: Mapping[str, Any] | None) -> Source:
        """``versions[].source`` as written (None: no source, an ensemble's version)."""
        return parse(cls, data)

    def as_dict(self) -> dict[str, Any]:
        """The source as the spec states it, without empty values (what identifies the fetched content)."""
        return {k: v for k, v in as_body(self).items() if v or k == "pathStyle"}


@dataclass(frozen=True, kw_only=True)
class ModelVersion:
    version: int = spec_field(
        "version",
        "Version number (the folder name).",
        required=True,
        format="int64",
        minimum=1,
        key_order=("type", "format", "minimum"),
    )
    #: None: an ensemble's version (its folder stays empty)
    source: Source | None = spec_field(
        "source",
        "Where the version's model file comes from: a uri (https/http with sha256, s3:// or gs:// for an "
        "object or a prefix/ folder, oci:// for an ORAS artifact or a modelcar image, hf:// for a Hugging Face Hub "
        "file or folder, az:// for an Azure blob or a prefix/ folder) or a path on the repository volume. A folder "
        "(an s3 or gs prefix, an artifact's files, a modelcar's "
        "/models, a Hub repository's folder) fills the version folder (for "
        "tensorflow_savedmodel, model.savedmodel/); a single object is the model file. For tensorflow_savedmodel "
        "a single file is a tar archive (plain, gzip, bzip2 or xz) of the SavedModel "
        "folder, unpacked into model.savedmodel/ (only files and folders are taken). Omit only for ensembles "
        "(their version folders are empty).",
        default=None,
    )
    #: None: the version takes no part in the weighted split
    traffic_percent: int | None = spec_field(
        "trafficPercent",
        "Percent of the requests that name no version sent to this version (among the weighted "
        "versions that are ready). When any version has one, they must add up to 100.",
        default=None,
        minimum=0,
        maximum=100,
        key_order=("type", "format", "minimum", "maximum"),
    )


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """``spec.rollout``: the rule that promotes or rolls back the canary (``traffic.rollout``)."""

    window_seconds: int = spec_field(
        "windowSeconds",
        f"The window the numbers are taken over (default {model_spec.ROLLOUT_WINDOW_SECONDS}).",
        default=model_spec.ROLLOUT_WINDOW_SECONDS,
        minimum=10,
        maximum=3600,
        key_order=("type", "format", "minimum", "maximum"),
    )
    min_requests: int = spec_field(
        "minRequests",
        f"Canary requests in the window before any decision (default {model_spec.ROLLOUT_MIN_REQUESTS}).",
        default=model_spec.ROLLOUT_MIN_REQUESTS,
        minimum=1,
        key_order=("type", "format", "minimum"),
    )
    #: None: no limit
    max_error_rate: float | None = spec_field(
        "maxErrorRate",
        "Failed / all canary requests in the window above which it is rolled back.",
        default=None,
        minimum=0,
        maximum=1,
        key_order=("type", "minimum", "maximum"),
    )
    #: None: no limit
    max_p99_milliseconds: float | None = spec_field(
        "maxP99Milliseconds",
        "Canary p99 latency (inside the server) in the window above which it is rolled back.",
        default=None,
        minimum=0,
        key_order=("type", "minimum"),
    )
    promote: bool = spec_field(
        "promote", "Give the canary 100 percent after a full window within the limits (default true).", default=True
    )


@dataclass(frozen=True, kw_only=True)
class InferenceModelSpec:
    """The operator's part of the spec; the CRD's spec schema adds the ModelConfig fields (``model_crd``)."""

    DESCRIPTION: ClassVar[str] = (
        "The model's config.pbtxt (Triton's ModelConfig, camelCase field names) plus where each version comes from."
    )
    SCHEMA_KEY_ORDER: ClassVar[tuple[str, ...]] = ("type", "properties", "required", "description")
    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {"rule": "has(self.platform) || has(self.backend)", "message": "give spec.platform or spec.backend"},
        {
            "rule": "!self.versions.exists(v, has(v.trafficPercent)) || "
            "self.versions.filter(v, has(v.trafficPercent)).map(v, v.trafficPercent).sum() == 100",
            "message": "spec.versions[].trafficPercent must add up to 100",
        },
        {
            "rule": "self.versions.all(v, self.versions.exists_one(w, w.version == v.version))",
            "message": "spec.versions: version numbers must be unique",
        },
        {
            "rule": "!has(self.inputs) || self.inputs.all(i, self.inputs.exists_one(j, j.name == i.name))",
            "message": "spec.inputs: tensor names must be unique",
        },
        {
            "rule": "!has(self.outputs) || self.outputs.all(o, self.outputs.exists_one(p, p.name == o.name))",
            "message": "spec.outputs: tensor names must be unique",
        },
        {
            "rule": "!has(self.dynamicBatching) || !has(self.dynamicBatching.preferredBatchSize) || "
            "self.dynamicBatching.preferredBatchSize.all(s, has(self.maxBatchSize) && s <= self.maxBatchSize)",
            "message": "dynamicBatching.preferredBatchSize entries must not exceed maxBatchSize",
        },
        {
            "rule": "!has(self.modelWarmup) || self.modelWarmup.all(w, !has(w.batchSize) || w.batchSize <= 1 || "
            "(has(self.maxBatchSize) && w.batchSize <= self.maxBatchSize))",
            "message": "modelWarmup batchSize must not exceed maxBatchSize",
        },
        {
            "rule": "(has(self.maxBatchSize) && self.maxBatchSize > 0) || !has(self.inputs) || "
            "self.inputs.all(i, size(i.dims) > 0 || has(i.reshape))",
            "message": "with maxBatchSize 0 every input needs its full shape in dims",
        },
        {
            "rule": "(has(self.platform) && self.platform == 'ensemble') == has(self.ensembleScheduling)",
            "message": "ensembleScheduling is required with platform 'ensemble' and only valid with it",
        },
        {
            "rule": "(has(self.platform) && self.platform == 'ensemble') || self.versions.all(v, has(v.source))",
            "message": "every version needs a source (uri or path) unless the platform is 'ensemble'",
        },
        {
            "rule": "!has(self.versionPolicy) || !has(self.versionPolicy.specific) || "
            "self.versionPolicy.specific.versions.all(n, self.versions.exists(v, v.version == n))",
            "message": "versionPolicy.specific lists a version that is not in spec.versions",
        },
        {
            "rule": "[has(self.dynamicBatching), has(self.sequenceBatching), has(self.ensembleScheduling)]"
            ".filter(x, x).size() <= 1",
            "message": "set at most one of dynamicBatching, sequenceBatching, ensembleScheduling",
        },
    )

    server: str = spec_field(
        "server",
        "Name of the InferenceServer (same namespace) whose repository holds this model.",
        required=True,
        minLength=1,
        maxLength=63,
        pattern="^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        key_order=_STRING_ORDER,
    )
    versions: tuple[ModelVersion, ...] = spec_field(
        "versions",
        "Versions of the model, each rendered into its numeric version folder. Removing an entry removes its folder.",
        required=True,
        minItems=1,
        maxItems=MAX_VERSIONS,
        key_order=("type", "minItems", "maxItems"),
    )
    #: None: weights (if any) stay as the spec gives them
    rollout: Rollout | None = spec_field(
        "rollout",
        "Promote or roll back the canary (the highest version with a trafficPercent under 100) by "
        "its numbers over a window, read from the servers' statistics.",
        default=None,
    )
    #: None: no budget, no ColdStartBudget condition
    cold_start_budget_seconds: float | None = spec_field(
        "coldStartBudgetSeconds",
        "Seconds a cold start may take, from the operator fetching the artifacts to each server "
        "replica's first successful inference (fetch, render, load, warm-up, first inference; see "
        "status.coldStart). The ColdStartBudget condition turns False naming the phase in which a replica's "
        "cold start passed it.",
        default=None,
        minimum=0,
        exclusiveMinimum=True,
        key_order=("type", "minimum", "exclusiveMinimum"),
    )

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> InferenceModelSpec:
        """The custom object's spec (``body`` is the whole object) as typed, defaults applied."""
        return parse(cls, body["spec"])

    def weights(self) -> dict[int, float]:
        """``versions[].trafficPercent`` by version ({}: none given)."""
        return version_weights(self.versions)


def version_weights(versions: Iterable[ModelVersion]) -> dict[int, float]:
    """``trafficPercent`` by version ({}: none given)."""
    return {v.version: float(v.traffic_percent) for v in versions if v.traffic_percent is not None}


#: the spec keys that are the operator's; every other key is the ModelConfig's
OPERATOR_FIELDS = tuple(api_field(f).json for f in dataclasses.fields(InferenceModelSpec))


def config_part(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's ModelConfig fields, as the object states them (``render.spec_to_config`` reads them)."""
    return {k: v for k, v in spec.items() if k not in OPERATOR_FIELDS}


@dataclass(frozen=True)
class InferenceModel:
    """One InferenceModel as a reconcile reads it: parsed once (``from_body``), then read by attribute."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: InferenceModelSpec
    #: the ModelConfig part of the spec, as written (its schema is the proto's: ``schema``)
    config: Mapping[str, Any]
    #: the status the object carries (what the last reconcile wrote; {} for a new object)
    status: Mapping[str, Any]
    #: the object itself (events are posted about it)
    body: Mapping[str, Any]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> InferenceModel:
        meta, spec = body["metadata"], body["spec"]
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            generation=meta.get("generation", 0),
            spec=InferenceModelSpec.from_body(body),
            config=config_part(spec),
            status=body.get("status") or {},
            body=body,
        )


resolve(InferenceModelSpec)
