"""The model configuration schema (Triton's ModelConfig), defined once.

The server parses ``config.pbtxt`` with it; the operator renders ``config.pbtxt`` with it.
"""

from . import model_config_pb2 as pb
from .codec import (
    ConfigError,
    config_from_dict,
    config_from_json,
    config_to_dict,
    config_to_text,
    load_config_file,
    parse_config_text,
)
from .validate import KNOWN_PLATFORMS, validate_config

ModelConfig = pb.ModelConfig

__all__ = [
    "KNOWN_PLATFORMS",
    "ConfigError",
    "ModelConfig",
    "config_from_dict",
    "config_from_json",
    "config_to_dict",
    "config_to_text",
    "load_config_file",
    "parse_config_text",
    "pb",
    "validate_config",
]
