"""The CRDs, generated: the InferenceModel schema is derived from the server's ``model_config.proto``.

One source of truth: every config field the CRD accepts is a proto field under its protobuf JSON name
(``max_queue_delay_microseconds`` → ``maxQueueDelayMicroseconds``), so ``render.spec_to_config`` can
hand the spec to ``json_format.ParseDict`` unchanged. The only renames are the Kubernetes-style plurals
in ``TOP_LEVEL_ALIASES`` and data types written as KServe v2 names (``FP32``, not ``TYPE_FP32``).

``python -m kubeinfer.operator.schema`` (from the repository root) rewrites ``crds/`` and the Helm chart's
``crds/``; a unit test fails when either drifts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import descriptor
from kubeinfer.server.config import MAX_FILE_NAME_BYTES, pb
from kubeinfer.server.vocabulary import datatypes

from .descriptions import CONFIG_FIELDS

GROUP = "serving.kubeinfer.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: proto field → CRD field where Kubernetes convention (plural lists) differs from the proto name
TOP_LEVEL_ALIASES = {"input": "inputs", "output": "outputs", "instance_group": "instanceGroups"}
#: the ModelConfig fields an InferenceModel may set (``name`` comes from metadata.name)
CONFIG_TOP_FIELDS = (
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "dynamic_batching",
    "instance_group",
    "version_policy",
    "ensemble_scheduling",
    "parameters",
    "optimization",
    "model_warmup",
    "default_model_filename",
)
V2_DATA_TYPES = list(datatypes.BY_V2)
MAX_TENSORS = 128
MAX_DIMS = 16
MAX_VERSIONS = 64
MAX_WARMUPS = 32
NAME_MAX = 253

_INTS = {
    descriptor.FieldDescriptor.TYPE_INT32: ("int32", None),
    descriptor.FieldDescriptor.TYPE_SINT32: ("int32", None),
    descriptor.FieldDescriptor.TYPE_SFIXED32: ("int32", None),
    descriptor.FieldDescriptor.TYPE_UINT32: ("int32", 0),
    descriptor.FieldDescriptor.TYPE_FIXED32: ("int32", 0),
    descriptor.FieldDescriptor.TYPE_INT64: ("int64", None),
    descriptor.FieldDescriptor.TYPE_SINT64: ("int64", None),
    descriptor.FieldDescriptor.TYPE_SFIXED64: ("int64", None),
    descriptor.FieldDescriptor.TYPE_UINT64: ("int64", 0),
    descriptor.FieldDescriptor.TYPE_FIXED64: ("int64", 0),
}
#: tighter lower bounds than the proto type gives (keyed like CONFIG_FIELDS)
_MINIMUMS = {
    "ModelConfig.max_batch_size": 0,
    "ModelVersionPolicy.Latest.num_versions": 1,
    "ModelVersionPolicy.Specific.versions": 1,
    "ModelDynamicBatching.preferred_batch_size": 1,
    "ModelInstanceGroup.count": 1,
    "ModelInstanceGroup.gpus": 0,
    "ModelInput.dims": -1,
    "ModelOutput.dims": -1,
    "ModelTensorReshape.shape": -1,
    "ModelWarmup.Input.dims": 1,
    "ModelEnsembling.Step.model_version": -1,
}
_DIM_FIELDS = {"ModelInput.dims", "ModelOutput.dims", "ModelTensorReshape.shape"}
_NAME_FIELDS = {"ModelInput.name", "ModelOutput.name", "ModelEnsembling.Step.model_name"}
#: file names joined to a model's folder: CEL mirror of ``kubeinfer.server.config.check_file_name``
_FILE_NAME_FIELDS = {
    "ModelConfig.default_model_filename",
    "ModelConfig.cc_model_filenames",
    "ModelOutput.label_filename",
    "ModelWarmup.Input.input_data_file",
    "ModelSequenceBatching.InitialState.data_file",
}
FILE_NAME_RULES = [
    {
        "rule": "self.matches('^[^./\\\\\\\\\\\\x00-\\\\x1f\\\\x7f][^/\\\\\\\\\\\\x00-\\\\x1f\\\\x7f]*$')",
        "message": "must be one file name in the model's folder: no '/', '\\' or control characters, "
        "not starting with '.'",
    },
]
#: extra rules on messages that span fields
_MESSAGE_RULES = {
    "ModelDynamicBatching": [
        {
            "rule": "!has(self.defaultPriorityLevel) || self.defaultPriorityLevel == 0 || "
            "(has(self.priorityLevels) && self.defaultPriorityLevel <= self.priorityLevels)",
            "message": "defaultPriorityLevel must be within 1..priorityLevels",
        },
    ],
}


def _key(desc: descriptor.Descriptor, fd: descriptor.FieldDescriptor) -> str:
    return f"{desc.full_name.removeprefix(pb.DESCRIPTOR.package + '.')}.{fd.name}"


def crd_field_name(fd: descriptor.FieldDescriptor, top: bool) -> str:
    return TOP_LEVEL_ALIASES.get(fd.name, fd.json_name) if top else fd.json_name


def _scalar_schema(fd: descriptor.FieldDescriptor, key: str) -> dict[str, Any]:
    if fd.enum_type is not None:
        if fd.enum_type.full_name == pb.DataType.DESCRIPTOR.full_name:
            return {"type": "string", "enum": V2_DATA_TYPES}
        return {"type": "string", "enum": [v.name for v in fd.enum_type.values]}
    if fd.message_type is not None:
        return message_schema(fd.message_type)
    if fd.type in _INTS:
        fmt, minimum = _INTS[fd.type]
        schema: dict[str, Any] = {"type": "integer", "format": fmt}
        minimum = _MINIMUMS.get(key, minimum)
        if minimum is not None:
            schema["minimum"] = minimum
        if key in _DIM_FIELDS:
            schema["x-kubernetes-validations"] = [
                {"rule": "self != 0", "message": "a dimension is a positive size or -1 (variable)"}
            ]
        return schema
    if fd.type in (descriptor.FieldDescriptor.TYPE_FLOAT, descriptor.FieldDescriptor.TYPE_DOUBLE):
        return {"type": "number"}
    if fd.type == descriptor.FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if fd.type == descriptor.FieldDescriptor.TYPE_STRING:
        schema = {"type": "string"}
        if key in _NAME_FIELDS:
            schema.update(minLength=1, maxLength=NAME_MAX)
        if key in _FILE_NAME_FIELDS:
            schema.update(minLength=1, maxLength=MAX_FILE_NAME_BYTES, **{"x-kubernetes-validations": FILE_NAME_RULES})
        return schema
    raise TypeError(f"no CRD schema for proto field {key} (type {fd.type})")


def field_schema(desc: descriptor.Descriptor, fd: descriptor.FieldDescriptor) -> dict[str, Any]:
    key = _key(desc, fd)
    if key not in CONFIG_FIELDS:
        raise KeyError(f"no description for config field {key}; add it to operator/descriptions.py")
    entry = fd.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value_fd = entry.fields_by_name["value"]
        schema: dict[str, Any] = {"type": "object", "additionalProperties": _scalar_schema(value_fd, key)}
        if key in _FILE_NAME_FIELDS or key == "ModelWarmup.inputs":
            schema["maxProperties"] = MAX_TENSORS  # bounds the CEL cost of the file-name rule inside
    elif fd.is_repeated:
        schema = {"type": "array", "items": _scalar_schema(fd, key)}
        if key in _DIM_FIELDS:
            schema["maxItems"] = MAX_DIMS
        elif fd.message_type is not None and fd.message_type.full_name in (
            pb.ModelInput.DESCRIPTOR.full_name,
            pb.ModelOutput.DESCRIPTOR.full_name,
        ):
            schema["maxItems"] = MAX_TENSORS
        elif key in ("ModelDynamicBatching.preferred_batch_size", "ModelVersionPolicy.Specific.versions"):
            schema["maxItems"] = MAX_VERSIONS
        elif key == "ModelConfig.model_warmup":
            schema["maxItems"] = MAX_WARMUPS
    else:
        schema = _scalar_schema(fd, key)
    return {"description": CONFIG_FIELDS[key], **schema}


def _oneof_rules(desc: descriptor.Descriptor) -> list[dict[str, str]]:
    rules = []
    for oneof in desc.oneofs:
        fields = [f for f in oneof.fields]
        if len(fields) < 2:  # proto3 `optional` is a synthetic one-field oneof
            continue
        names = [f.json_name for f in fields]
        count = " + ".join(f"(has(self.{n}) ? 1 : 0)" for n in names)
        rules.append({"rule": f"{count} <= 1", "message": f"set at most one of {', '.join(names)}"})
    return rules


def message_schema(desc: descriptor.Descriptor, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    top = only is not None
    props: dict[str, Any] = {}
    for fd in desc.fields:
        if top and fd.name not in only:  # type: ignore[operator]
            continue
        props[crd_field_name(fd, top)] = field_schema(desc, fd)
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if desc.name in ("ModelInput", "ModelOutput"):
        schema["required"] = ["name", "dataType"]
    if desc.name == "Step":
        schema["required"] = ["modelName"]
    if desc.name == "Accelerator":
        schema["required"] = ["name"]
    rules = [] if top else _oneof_rules(desc)
    rules += _MESSAGE_RULES.get(desc.name, [])
    if rules:
        schema["x-kubernetes-validations"] = rules
    if not props:
        del schema["properties"]
    return schema


# ---------------------------------------------------------------------------------------- InferenceModel

_CONDITIONS = {
    "type": "array",
    "description": "Latest observations of the object's state (Kubernetes condition convention).",
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "items": {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Condition type, CamelCase (e.g. Ready)."},
            "status": {
                "type": "string",
                "enum": ["True", "False", "Unknown"],
                "description": "True, False or Unknown.",
            },
            "reason": {"type": "string", "description": "CamelCase reason for the last transition."},
            "message": {"type": "string", "description": "What happened and, for failures, what to fix."},
            "lastTransitionTime": {
                "type": "string",
                "format": "date-time",
                "description": "When status last changed.",
            },
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "metadata.generation the condition was computed for.",
            },
        },
    },
}

_SOURCE = {
    "type": "object",
    "description": "Where the version's model file comes from: a uri (http/https, with sha256) or a path on the "
    "repository volume. Omit only for ensembles (their version folders are empty).",
    "properties": {
        "uri": {
            "type": "string",
            "maxLength": 2048,
            "pattern": "^https?://",
            "description": "http(s) URL of the model file; downloaded, size-limited and checked against sha256.",
        },
        "sha256": {
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "Lower-case hex SHA-256 of the file; required with uri, verified for path when given.",
        },
        "path": {
            "type": "string",
            "minLength": 1,
            "maxLength": 1024,
            "description": "File path relative to this namespace's folder on the repository volume "
            "(<volume>/<namespace>/, e.g. uploads/model.onnx). Must stay inside that folder and must not pass "
            "through a symlink.",
        },
    },
    "x-kubernetes-validations": [
        {"rule": "has(self.uri) != has(self.path)", "message": "give exactly one of source.uri or source.path"},
        {"rule": "!has(self.uri) || has(self.sha256)", "message": "source.uri needs source.sha256 (hex SHA-256)"},
        {
            "rule": "!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)[.][.](/|$)'))",
            "message": "source.path must be relative to the repository volume and must not contain '..'",
        },
    ],
}

_VERSIONS = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_VERSIONS,
    "description": "Versions of the model, each rendered into its numeric version folder. Removing an entry "
    "removes its folder.",
    "items": {
        "type": "object",
        "required": ["version"],
        "properties": {
            "version": {
                "type": "integer",
                "format": "int64",
                "minimum": 1,
                "description": "Version number (the folder name).",
            },
            "source": _SOURCE,
        },
    },
}

_MODEL_RULES = [
    {"rule": "has(self.platform) || has(self.backend)", "message": "give spec.platform or spec.backend"},
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
        "rule": "[has(self.dynamicBatching), has(self.ensembleScheduling)].filter(x, x).size() <= 1",
        "message": "set at most one of dynamicBatching, ensembleScheduling",
    },
]


def inference_model_spec_schema() -> dict[str, Any]:
    schema = message_schema(pb.ModelConfig.DESCRIPTOR, CONFIG_TOP_FIELDS)
    schema["properties"]["platform"]["maxLength"] = 64
    schema["properties"]["backend"]["maxLength"] = 64
    schema["properties"] = {
        "server": {
            "type": "string",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "description": "Name of the InferenceServer (same namespace) whose repository holds this model.",
        },
        **schema["properties"],
        "versions": _VERSIONS,
    }
    schema["required"] = ["server", "versions"]
    schema["description"] = (
        "The model's config.pbtxt (Triton's ModelConfig, camelCase field names) plus where each version comes from."
    )
    schema["x-kubernetes-validations"] = _MODEL_RULES
    return schema


def _ints(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "integer", "format": "int64"}, "description": description}


INFERENCE_MODEL_STATUS = {
    "type": "object",
    "description": "Observed state of the model, from the repository and the server's repository index.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "description": "metadata.generation last reconciled.",
        },
        "conditions": _CONDITIONS,
        "targetVersions": _ints("Versions the version policy selects from spec.versions."),
        "activeVersions": _ints("Versions the server reports READY."),
        "activeVersion": {"type": "integer", "format": "int64", "description": "Highest READY version."},
        "renderedVersions": _ints("Version folders present in the repository."),
        "versionStates": {
            "type": "array",
            "description": "Per-version state from the server's repository index.",
            "items": {
                "type": "object",
                "properties": {
                    "version": {"type": "integer", "format": "int64", "description": "Version number."},
                    "state": {
                        "type": "string",
                        "description": "READY, LOADING, UNLOADING or UNAVAILABLE (as the server reports it).",
                    },
                    "reason": {"type": "string", "description": "Why the version is not READY, if it is not."},
                },
            },
        },
        "lastFailure": {
            "type": "object",
            "description": "The most recent failure (render, fetch or load).",
            "properties": {
                "version": {"type": "integer", "format": "int64", "description": "Version concerned, if any."},
                "reason": {"type": "string", "description": "CamelCase reason."},
                "message": {"type": "string", "description": "What went wrong and what to fix."},
                "time": {"type": "string", "format": "date-time", "description": "When it happened."},
            },
        },
        "repositoryPath": {
            "type": "string",
            "description": "Folder of the model inside the repository volume (<server subPath>/<model>).",
        },
        "endpoint": {
            "type": "object",
            "description": "Where to send requests for this model.",
            "properties": {
                "http": {"type": "string", "description": "host:port of the server's HTTP/REST endpoint."},
                "grpc": {"type": "string", "description": "host:port of the server's gRPC endpoint."},
                "model": {"type": "string", "description": "Model name to use in requests."},
            },
        },
    },
}


def _crd(
    kind: str, plural: str, short: str, spec: dict, status: dict, columns: list, subresources: dict
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["kubeinfer"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": f"{kind}: see `kubectl explain {kind.lower()}.spec`.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version of the object."},
                                "kind": {"type": "string", "description": "Kind of the object."},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def inference_model_crd() -> dict[str, Any]:
    columns = [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Active Version", "type": "integer", "jsonPath": ".status.activeVersion"},
        {"name": "Server", "type": "string", "jsonPath": ".spec.server"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {
            "name": "Reason",
            "type": "string",
            "priority": 1,
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        },
    ]
    return _crd(
        "InferenceModel",
        "inferencemodels",
        "im",
        inference_model_spec_schema(),
        INFERENCE_MODEL_STATUS,
        columns,
        {"status": {}},
    )


# --------------------------------------------------------------------------------------- InferenceServer


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _i(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "format": "int32", "description": description, **extra}


_QUANTITY = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}


def _probe(what: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"Timing of the {what} (the path is fixed by the server).",
        "properties": {
            "initialDelaySeconds": _i("Seconds before the first probe.", minimum=0),
            "periodSeconds": _i(f"Seconds between probes (default {period}).", minimum=1),
            "timeoutSeconds": _i("Seconds before a probe times out (default 1).", minimum=1),
            "failureThreshold": _i(f"Failed probes in a row that count as failure (default {failures}).", minimum=1),
        },
    }


INFERENCE_SERVER_SPEC = {
    "type": "object",
    "description": "A pool of kubeinfer-server pods serving one model repository folder.",
    "required": ["image", "repository"],
    "properties": {
        "replicas": _i("Number of server pods (the scale subresource; an HPA writes it).", minimum=0, default=1),
        "image": _s("Server container image.", minLength=1),
        "imagePullPolicy": _s("Image pull policy.", enum=["Always", "IfNotPresent", "Never"]),
        "imagePullSecrets": {
            "type": "array",
            "description": "Secrets for pulling the image.",
            "items": {
                "type": "object",
                "properties": {"name": _s("Secret name.")},
                "required": ["name"],
            },
        },
        "resources": {
            "type": "object",
            "description": "Container resources, e.g. limits: {nvidia.com/gpu: 1, memory: 16Gi}.",
            "properties": {
                "limits": {
                    "type": "object",
                    "description": "Resource limits (GPUs are requested with nvidia.com/gpu).",
                    "additionalProperties": _QUANTITY,
                },
                "requests": {
                    "type": "object",
                    "description": "Resource requests.",
                    "additionalProperties": _QUANTITY,
                },
            },
        },
        "nodeSelector": {
            "type": "object",
            "description": "Node labels the pods must match.",
            "additionalProperties": {"type": "string"},
        },
        "tolerations": {
            "type": "array",
            "description": "Pod tolerations (core/v1 Toleration), e.g. for GPU node taints.",
            "items": {
                "type": "object",
                "properties": {
                    "key": _s("Taint key."),
                    "operator": _s("Exists or Equal.", enum=["Exists", "Equal"]),
                    "value": _s("Taint value."),
                    "effect": _s("Taint effect.", enum=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
                    "tolerationSeconds": {
                        "type": "integer",
                        "format": "int64",
                        "description": "How long a NoExecute taint is tolerated.",
                    },
                },
            },
        },
        "affinity": {
            "type": "object",
            "description": "Pod affinity (core/v1 Affinity), passed through unchanged.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "podAnnotations": {
            "type": "object",
            "description": "Extra annotations on the server pods (e.g. for Prometheus scraping).",
            "additionalProperties": {"type": "string"},
        },
        "repository": {
            "type": "object",
            "description": "The model repository volume.",
            "required": ["claimName"],
            "properties": {
                "claimName": _s("PersistentVolumeClaim holding the repository (ReadWriteMany).", minLength=1),
                "subPath": _s(
                    "Folder of this server's repository inside this namespace's folder of the volume "
                    "(<volume>/<namespace>/<subPath>); default <name>.",
                    pattern="^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
                    maxLength=1024,
                ),
            },
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.subPath) || !self.subPath.matches('(^|/)[.]')",
                    "message": "repository.subPath must not contain '.', '..' or hidden (dot-named) components",
                }
            ],
        },
        "backends": {
            "type": "array",
            "description": "Backends the server image provides; models needing another are refused. "
            "Default: onnxruntime, tensorrt, python.",
            "items": {"type": "string", "enum": ["onnxruntime", "tensorrt", "python"]},
            "x-kubernetes-list-type": "set",
        },
        "server": {
            "type": "object",
            "description": "kubeinfer-server flags.",
            "properties": {
                "httpPort": _i("HTTP/REST port (default 8000).", minimum=1, maximum=65535),
                "grpcPort": _i("gRPC port (default 8001).", minimum=1, maximum=65535),
                "metricsPort": _i("Prometheus metrics port (default 8002).", minimum=1, maximum=65535),
                "pollIntervalSeconds": _i(
                    "Repository poll interval in seconds (--repository-poll-secs, default 5).", minimum=1
                ),
                "logLevel": _s("Log level (default info).", enum=["debug", "info", "warning", "error"]),
                "extraArgs": {
                    "type": "array",
                    "description": "Extra command-line flags appended to the server's arguments.",
                    "items": {"type": "string"},
                },
            },
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.httpPort) ? self.httpPort : 8000, has(self.grpcPort) ? self.grpcPort : 8001, "
                    "has(self.metricsPort) ? self.metricsPort : 8002].all(p, "
                    "[has(self.httpPort) ? self.httpPort : 8000, has(self.grpcPort) ? self.grpcPort : 8001, "
                    "has(self.metricsPort) ? self.metricsPort : 8002].exists_one(q, q == p))",
                    "message": "httpPort, grpcPort and metricsPort must differ",
                }
            ],
        },
        "autoscaling": {
            "type": "object",
            "description": "Creates an autoscaling/v2 HPA that scales this InferenceServer.",
            "required": ["maxReplicas"],
            "properties": {
                "minReplicas": _i("Fewest replicas (default 1).", minimum=1),
                "maxReplicas": _i("Most replicas.", minimum=1),
                "target": {
                    "type": "object",
                    "description": "Shorthand for one metric, used when metrics is empty. Default: "
                    "QueueDurationPerRequest at 5000 µs.",
                    "properties": {
                        "metric": _s(
                            "QueueDurationPerRequest: Pods metric nv_inference_queue_duration_us_per_request "
                            "(average queue µs per request, from a prometheus-adapter rule); PendingRequests: "
                            "Pods metric nv_inference_pending_request_count; CPU: average CPU utilization.",
                            enum=["QueueDurationPerRequest", "PendingRequests", "CPU"],
                        ),
                        "averageValue": {
                            **_QUANTITY,
                            "description": "Target per pod (µs, requests, or CPU utilization percent).",
                        },
                    },
                },
                "metrics": {
                    "type": "array",
                    "description": "autoscaling/v2 MetricSpec list, passed to the HPA unchanged.",
                    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
                "behavior": {
                    "type": "object",
                    "description": "autoscaling/v2 HPA behavior, passed through unchanged.",
                    "x-kubernetes-preserve-unknown-fields": True,
                },
            },
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                    "message": "autoscaling.minReplicas must not exceed maxReplicas",
                }
            ],
        },
        "sharedMemorySize": {
            **_QUANTITY,
            "description": "Size limit of the memory-backed /dev/shm (default 1Gi; python backend IPC).",
        },
        "drainSeconds": _i(
            "Seconds the pod keeps serving after it is told to stop (preStop), before the server drains (default 10).",
            minimum=0,
        ),
        "probes": {
            "type": "object",
            "description": "Probe timing: liveness /v2/health/live, readiness and startup /v2/health/ready.",
            "properties": {
                "liveness": _probe("liveness probe", 10, 3),
                "readiness": _probe("readiness probe", 5, 3),
                "startup": _probe("startup probe (sized for model loading)", 10, 60),
            },
        },
    },
}

INFERENCE_SERVER_STATUS = {
    "type": "object",
    "description": "Observed state of the server pool.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "description": "metadata.generation last reconciled.",
        },
        "conditions": _CONDITIONS,
        "replicas": _i("Pods of the Deployment."),
        "readyReplicas": _i("Ready pods of the Deployment."),
        "selector": _s("Label selector of the pods (scale subresource)."),
        "models": {
            "type": "array",
            "description": "InferenceModels that name this server.",
            "items": {"type": "string"},
        },
        "endpoint": _s("host:port of the HTTP endpoint (the Service)."),
    },
}


def inference_server_crd() -> dict[str, Any]:
    columns = [
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Available", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Available")].status'},
        {"name": "Image", "type": "string", "priority": 1, "jsonPath": ".spec.image"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return _crd(
        "InferenceServer",
        "inferenceservers",
        "isrv",
        INFERENCE_SERVER_SPEC,
        INFERENCE_SERVER_STATUS,
        columns,
        {"status": {}, "scale": scale},
    )


CRD_FILES = {
    "serving.kubeinfer.io_inferencemodels.yaml": inference_model_crd,
    "serving.kubeinfer.io_inferenceservers.yaml": inference_server_crd,
}
#: the CRDs are written to both places: kubectl users apply crds/, helm installs the chart's crds/
OUTPUT_DIRS = ("crds", "helm/kubeinfer/crds")
HEADER = "# Generated by `python -m kubeinfer.operator.schema` from server/config/model_config.proto; do not edit.\n"


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared sub-schemas out in full: CRD YAML is read by people and by tools without anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=110)


def render_crd_files() -> dict[str, str]:
    return {name: HEADER + dump_yaml(build()) for name, build in CRD_FILES.items()}


def main(argv: list[str] | None = None) -> int:
    """Write the CRD files into each folder given (default: OUTPUT_DIRS, relative to the cwd)."""
    args = sys.argv[1:] if argv is None else argv
    for folder in args or OUTPUT_DIRS:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in render_crd_files().items():
            (out / name).write_text(text)
            print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
