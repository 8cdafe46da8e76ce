"""InferenceModel spec → ModelConfig (the server's own schema) → config.pbtxt. Pure functions.

The spec's config fields are protobuf JSON names, so ``json_format.ParseDict`` does the mapping; the
only translations are the plural list names (``schema.TOP_LEVEL_ALIASES``) and KServe v2 data type
names (``FP32`` ↔ ``TYPE_FP32``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import descriptor, json_format
from kubeinfer.server.config import (
    KNOWN_PLATFORMS,
    MODEL_CONFIG,
    ConfigError,
    config_to_text,
    pb,
    validate_config,
)
from kubeinfer.server.config.platforms import BUILTIN_BACKENDS, backend_for, model_filename
from kubeinfer.server.sources.uris import store_scheme
from kubeinfer.server.vocabulary import datatypes

from ..api.model_types import ModelVersion, Source, config_part, version_weights
from ..api.schema import CONFIG_TOP_FIELDS, TOP_LEVEL_ALIASES
from ..api.typed import parse
from ..traffic import rollout
from ..volume.rendered import RenderedModel

#: what an InferenceServer serves when its spec.backends is empty
DEFAULT_BACKENDS = BUILTIN_BACKENDS
_CRD_TO_PROTO = {v: k for k, v in TOP_LEVEL_ALIASES.items()}
_DATA_TYPE = pb.DataType.DESCRIPTOR.full_name
_INT_CPP_TYPES = {descriptor.FieldDescriptor.CPPTYPE_INT64, descriptor.FieldDescriptor.CPPTYPE_UINT64}


def _fields_by_crd_name(desc: descriptor.Descriptor, top: bool) -> dict[str, descriptor.FieldDescriptor]:
    out = {}
    for fd in desc.fields:
        if top and fd.name not in CONFIG_TOP_FIELDS:
            continue
        out[TOP_LEVEL_ALIASES.get(fd.name, fd.json_name) if top else fd.json_name] = fd
    return out


def _convert_value(fd: descriptor.FieldDescriptor, value: Any, to_config: bool) -> Any:
    if fd.enum_type is not None and fd.enum_type.full_name == _DATA_TYPE:
        if to_config:
            try:
                return datatypes.v2_to_config(value)
            except Exception:
                raise ConfigError(f"unknown dataType '{value}': use one of {', '.join(datatypes.BY_V2)}") from None
        return datatypes.config_to_v2(value)
    if fd.message_type is not None:
        return _convert_message(fd.message_type, value, to_config, top=False)
    if not to_config and isinstance(value, str) and fd.cpp_type in _INT_CPP_TYPES:
        return int(value)  # protobuf JSON writes 64-bit integers as strings
    return value


def _convert_message(
    desc: descriptor.Descriptor, data: Mapping[str, Any], to_config: bool, top: bool
) -> dict[str, Any]:
    """Walk ``data`` along the proto schema, renaming aliases and translating data type names."""
    fields = _fields_by_crd_name(desc, top)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if to_config:
            fd = fields.get(key)
            if fd is None:
                raise ConfigError(f"unknown field '{key}' in {desc.name}")
            out_key = fd.json_name  # type: ignore[attr-defined]  # a real attribute types-protobuf leaves out
        else:
            fd = desc.fields_by_camelcase_name.get(key) or desc.fields_by_name.get(key)  # type: ignore[attr-defined]
            if fd is None:
                continue
            out_key = TOP_LEVEL_ALIASES.get(fd.name, fd.json_name) if top else fd.json_name
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_fd = entry.fields_by_name["value"]
            out[out_key] = {k: _convert_value(value_fd, v, to_config) for k, v in value.items()}
        elif fd.is_repeated:
            out[out_key] = [_convert_value(fd, v, to_config) for v in value]
        else:
            out[out_key] = _convert_value(fd, value, to_config)
    return out


def spec_to_config(name: str, spec: Mapping[str, Any]) -> pb.ModelConfig:
    """The ModelConfig an InferenceModel spec describes (no validation beyond the schema's types); ``spec``
    may be the whole spec or its ModelConfig part (``InferenceModel.config``)."""
    data = _convert_message(MODEL_CONFIG, config_part(spec), to_config=True, top=True)
    config = pb.ModelConfig()
    try:
        json_format.ParseDict(data, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"spec does not fit the model config schema: {exc}") from None
    config.name = name
    return config


def config_to_spec(config: pb.ModelConfig) -> dict[str, Any]:
    """The inverse of ``spec_to_config`` for the config part (used to check round trips)."""
    data = json_format.MessageToDict(config)
    data.pop("name", None)
    return _convert_message(MODEL_CONFIG, data, to_config=False, top=True)


def render_model(
    name: str,
    spec: Mapping[str, Any],
    server_backends: Iterable[str] = DEFAULT_BACKENDS,
    server: str = "",
    traffic: Mapping[int, float] | None = None,
) -> RenderedModel:
    """``render_versions`` of a spec as the custom object states it (examples, tools, tests)."""
    versions = tuple(parse(ModelVersion, v) for v in spec.get("versions") or ())
    return render_versions(name, versions, spec, server_backends, server, traffic)


def render_versions(
    name: str,
    versions: Sequence[ModelVersion],
    config_fields: Mapping[str, Any],
    server_backends: Iterable[str] = DEFAULT_BACKENDS,
    server: str = "",
    traffic: Mapping[int, float] | None = None,
) -> RenderedModel:
    """Validate an InferenceModel (its ``versions`` and ModelConfig fields) against the server's schema and
    rules; ConfigError says what to fix.

    ``traffic``: the weights in force between versions (``rollout.weights_in_force``; None: the spec's)."""
    config = spec_to_config(name, config_fields)
    backends = sorted(server_backends)
    if config.platform and config.platform not in KNOWN_PLATFORMS:
        raise ConfigError(
            f"spec.platform '{config.platform}' is not served by kubeinfer-server: use one of "
            f"{', '.join(sorted(KNOWN_PLATFORMS))}"
        )
    needed = backend_for(config)
    if needed and needed not in backends:
        raise ConfigError(
            f"InferenceServer '{server}' does not provide backend '{needed}' (its spec.backends: "
            f"{', '.join(backends)}); pick a platform it serves or add '{needed}' to the server's spec.backends"
        )
    try:
        validate_config(config, name, available_backends=backends)
    except ConfigError as exc:
        raise ConfigError(f"invalid model config: {exc}") from None
    sources: dict[int, Source] = {}
    for entry in versions:
        version = entry.version
        if version in sources:
            raise ConfigError(f"spec.versions lists version {version} twice")
        source = entry.source or Source()
        if config.platform != "ensemble" and not (source.uri or source.path):
            raise ConfigError(f"spec.versions[{version}] needs source.uri or source.path")
        store = store_scheme(source.uri or "")  # an https Azure Blob URL is read by the Azure store: no sha256
        web = bool(source.uri) and str(source.uri).startswith(("http://", "https://")) and not store
        if source.uri and not web and not store:
            raise ConfigError(
                f"spec.versions[{version}].source.uri must be http(s)://, s3://, gs://, oci://, hf:// or az://"
            )
        if web and not source.sha256:
            raise ConfigError(f"spec.versions[{version}].source.uri needs source.sha256")
        if source.credentials_secret and (not source.uri or source.uri.startswith("http://")):
            raise ConfigError(
                f"spec.versions[{version}].source.credentialsSecret needs an https://, s3://, gs://, oci://, hf:// or "
                "az:// source.uri"
            )
        sources[version] = source
    if not sources:
        raise ConfigError("spec.versions is empty: list at least one version")
    rollout.apply_weights(config, version_weights(versions) if traffic is None else traffic, sources)
    if config.version_policy.HasField("specific"):
        missing = sorted(set(config.version_policy.specific.versions) - set(sources))
        if missing:
            raise ConfigError(f"versionPolicy.specific lists versions {missing} that are not in spec.versions")
    # None for ensembles: their version folders stay empty
    return RenderedModel(name, config, config_to_text(config), model_filename(config) or None, sources)
