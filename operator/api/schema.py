"""The ModelConfig proto as OpenAPI v3: the generator behind the InferenceModel CRD's config fields.

One source of truth: every config field the CRD accepts is a proto field under its protobuf JSON name
(``max_queue_delay_microseconds`` → ``maxQueueDelayMicroseconds``), so ``render.spec_to_config`` can
hand the spec to ``json_format.ParseDict`` unchanged. The only renames are the Kubernetes-style plurals
in ``TOP_LEVEL_ALIASES`` and data types written as KServe v2 names (``FP32``, not ``TYPE_FP32``).
The CRDs themselves are in ``model_crd`` and ``server_crd``; ``python -m kubeinfer.operator.api.crds`` writes them.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor
from kubeinfer.server.config import MAX_FILE_NAME_BYTES, pb
from kubeinfer.server.config.validate import OP_LIBRARY_ALTERNATIVE
from kubeinfer.server.config.version_policy import MIN_NUM_VERSIONS
from kubeinfer.server.vocabulary import datatypes

from .descriptions import CONFIG_FIELDS

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
    "sequence_batching",
    "instance_group",
    "version_policy",
    "ensemble_scheduling",
    "parameters",
    "optimization",
    "model_warmup",
    "response_cache",
    "default_model_filename",
    "model_operations",
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
    "ModelVersionPolicy.Latest.num_versions": MIN_NUM_VERSIONS,
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
#: bounds on lists whose items carry CEL rules (the API server's cost budget needs them) or are tiny by nature
_MAX_ITEMS = {
    "ModelSequenceBatching.control_input": MAX_TENSORS,
    "ModelSequenceBatching.ControlInput.control": 1,
    "ModelSequenceBatching.Control.int32_false_true": 2,
    "ModelSequenceBatching.Control.fp32_false_true": 2,
    "ModelSequenceBatching.Control.bool_false_true": 2,
    "ModelSequenceBatching.state": MAX_TENSORS,
    "ModelSequenceBatching.State.dims": MAX_DIMS,
    "ModelSequenceBatching.State.initial_state": 1,
    "ModelSequenceBatching.InitialState.dims": MAX_DIMS,
    "ModelSequenceBatching.StrategyOldest.preferred_batch_size": MAX_VERSIONS,
    "ModelOperations.op_library_filename": 16,
}
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
    {
        # maxLength counts characters; file systems (and the server's check) count UTF-8 bytes
        "rule": f"size(bytes(self)) <= {MAX_FILE_NAME_BYTES}",
        "message": f"must be at most {MAX_FILE_NAME_BYTES} bytes long in UTF-8",
    },
]
#: ``model_operations.op_library_filename``: CEL mirror of ``kubeinfer.server.config.check_op_library_filename``
#: (where an entry leads on disk is the server's check, at load)
OP_LIBRARY_FIELD = "ModelOperations.op_library_filename"
PATH_MAX = 4096
OP_LIBRARY_RULES = [
    {
        "rule": "self.startsWith('/') ? !self.matches('[\\\\x00-\\\\x1f\\\\x7f]') : size(bytes(self)) <= "
        + str(MAX_FILE_NAME_BYTES)
        + " && "
        + FILE_NAME_RULES[0]["rule"],
        "message": FILE_NAME_RULES[0]["message"] + OP_LIBRARY_ALTERNATIVE,
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
    json_name: str = fd.json_name  # type: ignore[attr-defined]  # a real attribute types-protobuf leaves out
    return TOP_LEVEL_ALIASES.get(fd.name, json_name) if top else json_name


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
        if key == OP_LIBRARY_FIELD:
            schema.update(minLength=1, maxLength=PATH_MAX, **{"x-kubernetes-validations": OP_LIBRARY_RULES})
        return schema
    raise TypeError(f"no CRD schema for proto field {key} (type {fd.type})")


def field_schema(desc: descriptor.Descriptor, fd: descriptor.FieldDescriptor) -> dict[str, Any]:
    key = _key(desc, fd)
    if key not in CONFIG_FIELDS:
        raise KeyError(f"no description for config field {key}; add it to operator/api/descriptions.py")
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
        elif key in _MAX_ITEMS:
            schema["maxItems"] = _MAX_ITEMS[key]
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
