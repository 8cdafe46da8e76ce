"""Text format (config.pbtxt) and JSON (HTTP config API, load overrides) for ModelConfig."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from google.protobuf import descriptor, json_format, text_format

from . import model_config_pb2 as pb

#: ModelConfig's descriptor, typed as protobuf's Python ``Descriptor`` (the stubs also admit upb's untyped one)
MODEL_CONFIG = cast(descriptor.Descriptor, pb.ModelConfig.DESCRIPTOR)


class ConfigError(ValueError):
    """A config that cannot be used; the message says what to fix."""


class ConfigParseError(ConfigError):
    """Config text that is not a ModelConfig; ``detail`` is protobuf's position and reason, for a caller
    that words the message its own way (a custom config's, in Triton's words)."""

    def __init__(self, source: str, detail: str) -> None:
        super().__init__(f"failed to parse {source}: {detail}")
        self.detail = detail


def parse_config_text(text: str, source: str = "config.pbtxt") -> pb.ModelConfig:
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigParseError(source, str(exc)) from None
    return config


def load_config_file(path: Path) -> pb.ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path.name}: {exc}") from None
    return parse_config_text(text, str(path.name))


def config_to_text(config: pb.ModelConfig) -> str:
    """Render config.pbtxt (the operator writes exactly this)."""
    return text_format.MessageToString(config)


_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def _ints_as_numbers(message_descriptor: descriptor.Descriptor, data: dict[str, Any]) -> None:
    """Protobuf JSON writes 64-bit ints as strings; Triton's config JSON writes numbers."""
    for fd in message_descriptor.fields:
        if fd.name not in data:
            continue
        value = data[fd.name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key_fd = fd.message_type.fields_by_name["key"]
            value_fd = fd.message_type.fields_by_name["value"]
            if value_fd.message_type is not None:
                for v in value.values():
                    _ints_as_numbers(value_fd.message_type, v)
            elif value_fd.type in _INT64_TYPES:
                for k in value:
                    value[k] = int(value[k])
            del key_fd
        elif fd.message_type is not None:
            items = value if fd.is_repeated else [value]
            for item in items:
                _ints_as_numbers(fd.message_type, item)
        elif fd.type in _INT64_TYPES:
            data[fd.name] = [int(v) for v in value] if fd.is_repeated else int(value)


def config_to_dict(config: pb.ModelConfig) -> dict[str, Any]:
    """The JSON shape Triton's ``GET /v2/models/{m}/config`` returns (snake_case, ints as numbers)."""
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _ints_as_numbers(MODEL_CONFIG, data)
    return data


def config_from_dict(data: dict[str, Any]) -> pb.ModelConfig:
    config = pb.ModelConfig()
    try:
        json_format.ParseDict(data, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"invalid model config JSON: {exc}") from None
    except RecursionError:  # ParseDict recurses with the data; what a client sends must never be a 500
        raise ConfigError("invalid model config JSON: nested too deeply") from None
    return config


def config_from_json(text: str | bytes) -> pb.ModelConfig:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"model config override is not valid JSON: {exc}") from None
    except RecursionError:  # json recurses with the nesting: what a client sends must never be a 500
        raise ConfigError("model config override is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError("model config override must be a JSON object")
    return config_from_dict(data)
