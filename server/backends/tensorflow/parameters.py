"""Triton's TensorFlow backend parameters (``config.pbtxt`` ``parameters``) and backend settings, checked at load.

Per model: ``TF_SIGNATURE_DEF`` (default ``serving_default``), ``TF_GRAPH_TAG`` (default ``serve``),
``TF_NUM_INTRA_THREADS`` / ``TF_NUM_INTER_THREADS`` (0: TensorFlow chooses), ``TF_USE_PER_SESSION_THREADS``
(each session its own thread pools instead of the process's), ``MAX_SESSION_SHARE_COUNT`` (instances per
TensorFlow session, default 1: a session each). ``TF_INIT_OPS_FILE`` (a GraphDef's init ops) is
not supported and ignored with a warning. Unknown keys are ignored, as Triton does. Parsed, and refused in
the same words, by ``backends.parameters``.

Per server (``--backend-config=tensorflow,<setting>=<value>``): ``allow-soft-placement`` (default true)
and ``default-max-batch-size`` (``settings``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...config import pb
from .. import settings
from ..parameters import bool_parameter, count_parameter, string_parameter, to_bool
from .graphdef import is_graphdef

log = logging.getLogger(__name__)

BACKEND = "tensorflow"


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


def _count(config: pb.ModelConfig, key: str, minimum: int) -> int | None:
    return count_parameter(config, key, minimum=minimum, backend="TensorFlow")


def parse_parameters(config: pb.ModelConfig) -> TFParameters:
    if string_parameter(config, "TF_INIT_OPS_FILE"):
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
    soft = settings.setting(BACKEND, "allow-soft-placement")
    return TFParameters(
        signature_def=string_parameter(config, "TF_SIGNATURE_DEF") or "",
        graph_tag=string_parameter(config, "TF_GRAPH_TAG") or "",
        intra_op_threads=_count(config, "TF_NUM_INTRA_THREADS", 0) or 0,
        inter_op_threads=_count(config, "TF_NUM_INTER_THREADS", 0) or 0,
        per_session_threads=bool(bool_parameter(config, "TF_USE_PER_SESSION_THREADS")),
        session_share_count=_count(config, "MAX_SESSION_SHARE_COUNT", 1) or 1,
        allow_soft_placement=True
        if soft is None
        else to_bool(soft, "--backend-config tensorflow,allow-soft-placement"),
    )
