"""Triton's TensorFlow backend parameters (``config.pbtxt`` ``parameters``) and backend settings, checked at load.

Per model: ``TF_SIGNATURE_DEF`` (default ``serving_default``), ``TF_GRAPH_TAG`` (default ``serve``),
``TF_NUM_INTRA_THREADS`` / ``TF_NUM_INTER_THREADS`` (0: TensorFlow chooses), ``TF_USE_PER_SESSION_THREADS``
(each session its own thread pools instead of the process's), ``MAX_SESSION_SHARE_COUNT`` (instances per
TensorFlow session, default 1: a session each). ``TF_INIT_OPS_FILE`` (a GraphDef's init ops) is
not supported and ignored with a warning. Unknown keys are ignored, as Triton does.

Per server (``--backend-config=tensorflow,<setting>=<value>``): ``allow-soft-placement`` (default true)
and ``default-max-batch-size`` (``settings``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...config import ConfigError, pb
from .. import settings
from .graphdef import is_graphdef

log = logging.getLogger(__name__)

BACKEND = "tensorflow"
_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}


@dataclass(frozen=True)
class TFParameters:
    #: "" → the default signature / tag (explicit ones are refused when missing, see ``savedmodel``)
    signature_def: str = ""
    graph_tag: str = ""
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    per_session_threads: bool = False
    session_share_count: int = 1
    allow_soft_placement: bool = True


def _value(config: pb.ModelConfig, key: str) -> str | None:
    p = config.parameters.get(key)
    return None if p is None else p.string_value.strip()


def _bool(raw: str, what: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigError(f"{what} must be true or false, got '{raw}'")


def _count(config: pb.ModelConfig, key: str, minimum: int, rule: str) -> int | None:
    raw = _value(config, key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        # Triton's text (tensorflow.cc ModelState::ParseParameters)
        raise ConfigError(f"parameter '{key}' must be {rule} number for TensorFlow model '{config.name}'")
    return value


def parse_parameters(config: pb.ModelConfig) -> TFParameters:
    if _value(config, "TF_INIT_OPS_FILE"):
        if is_graphdef(config):
            log.warning(
                "model '%s': TF_INIT_OPS_FILE is not supported: ignored (freeze the GraphDef's variables into "
                "constants, e.g. with tf.compat.v1.graph_util.convert_variables_to_constants)",
                config.name,
            )
        else:
            log.warning(
                "model '%s': TF_INIT_OPS_FILE is for GraphDef models; a SavedModel runs its own init op: ignored",
                config.name,
            )
    per_session = _value(config, "TF_USE_PER_SESSION_THREADS")
    soft = settings.setting(BACKEND, "allow-soft-placement")
    return TFParameters(
        signature_def=_value(config, "TF_SIGNATURE_DEF") or "",
        graph_tag=_value(config, "TF_GRAPH_TAG") or "",
        intra_op_threads=_count(config, "TF_NUM_INTRA_THREADS", 0, "non-negative") or 0,
        inter_op_threads=_count(config, "TF_NUM_INTER_THREADS", 0, "non-negative") or 0,
        per_session_threads=_bool(per_session, "parameter 'TF_USE_PER_SESSION_THREADS'") if per_session else False,
        session_share_count=_count(config, "MAX_SESSION_SHARE_COUNT", 1, "positive") or 1,
        allow_soft_placement=True if soft is None else _bool(soft, "--backend-config tensorflow,allow-soft-placement"),
    )
