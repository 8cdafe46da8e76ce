"""The model configuration schema (Triton's ModelConfig), defined once.

The server parses ``config.pbtxt`` with it; the operator renders ``config.pbtxt`` with it.
"""

from . import model_config_pb2 as pb
from .codec import (
    MODEL_CONFIG,
    ConfigError,
    ConfigParseError,
    config_from_dict,
    config_from_json,
    config_to_dict,
    config_to_text,
    load_config_file,
    parse_config_text,
)
from .normalize import check_instance_groups, normalize_config
from .platforms import KNOWN_PLATFORMS
from .triton_json import config_to_triton_json
from .validate import (
    MAX_FILE_NAME_BYTES,
    check_file_name,
    check_file_names,
    check_op_library_filename,
    validate_config,
)

ModelConfig = pb.ModelConfig

__all__ = [
    "KNOWN_PLATFORMS",
    "MAX_FILE_NAME_BYTES",
    "MODEL_CONFIG",
    "ConfigError",
    "ConfigParseError",
    "ModelConfig",
    "check_file_name",
    "check_file_names",
    "check_instance_groups",
    "check_op_library_filename",
    "config_from_dict",
    "config_from_json",
    "config_to_dict",
    "config_to_text",
    "config_to_triton_json",
    "load_config_file",
    "normalize_config",
    "parse_config_text",
    "pb",
    "validate_config",
]
