"""Traffic weights between a model's versions (canary), carried in config.pbtxt ``parameters``.

``parameters { key: "kubeinfer.version_traffic" value { string_value: "1:90,2:10" } }``: a request that
names no version goes to version 1 nine times in ten and to version 2 once, among those of the listed
versions that are ready (the weights of the ready ones are scaled to 100); a request that names a version
gets that version. Without the parameter the highest ready version serves, as in Triton.

Why a config parameter: config.pbtxt is the one file per model the server already reads and the operator
already writes atomically, and a parameter keeps it a valid Triton config (Triton hands parameters it does
not know to the backend, which ignores them). A change of the weights alone does not reload the versions
(``routing_neutral_digest``). Server and operator parse and render the value with these functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from . import model_config_pb2 as pb
from .codec import ConfigError

TRAFFIC_PARAMETER = "kubeinfer.version_traffic"


def parse_traffic(config: pb.ModelConfig) -> dict[int, float]:
    """Version → percent from the config's parameter ({}: none). ConfigError says what is wrong."""
    param = config.parameters.get(TRAFFIC_PARAMETER)
    if param is None or not param.string_value.strip():
        return {}
    weights: dict[int, float] = {}
    for item in param.string_value.split(","):
        version, sep, percent = item.strip().partition(":")
        try:
            v, p = int(version), float(percent)
        except ValueError:
            v, p = 0, -1.0
        if not sep or v < 1 or not 0 <= p <= 100 or v in weights:
            raise ConfigError(
                f"parameters '{TRAFFIC_PARAMETER}': '{param.string_value}' is not a list of "
                "<version>:<percent> (versions positive and listed once, percents 0 to 100), e.g. '1:90,2:10'"
            )
        weights[v] = p
    if sum(weights.values()) <= 0:
        raise ConfigError(f"parameters '{TRAFFIC_PARAMETER}': '{param.string_value}' gives no version any traffic")
    return weights


def render_traffic(weights: Mapping[int, float]) -> str:
    """The parameter's value for ``weights`` (versions in order, whole percents without a decimal point)."""
    return ",".join(f"{v}:{int(p) if float(p).is_integer() else p}" for v, p in sorted(weights.items()))


def routing_neutral_digest(config: pb.ModelConfig) -> str:
    """A digest of ``config`` without the traffic parameter: versions whose config differs only in their
    weights are not reloaded."""
    copy = pb.ModelConfig()
    copy.CopyFrom(config)
    if TRAFFIC_PARAMETER in copy.parameters:
        del copy.parameters[TRAFFIC_PARAMETER]
    return hashlib.sha1(copy.SerializeToString(deterministic=True)).hexdigest()
