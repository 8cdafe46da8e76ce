"""What a SavedModel folder offers, read from its ``saved_model.pb`` without loading it: tag sets and signatures.

A signature (``SignatureDef``) maps the names clients use (its keys, which Triton makes the config's tensor
names) to graph tensors (``serving_default_x:0``), with a dtype and a shape (-1 for unknown sizes; an
unknown rank reads as rank 0, as Triton reads it). Messages follow Triton's TensorFlow backend
(``src/tensorflow_backend_tf.cc``) where it has them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import ConfigError

log = logging.getLogger(__name__)

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"
#: Triton's defaults when TF_GRAPH_TAG / TF_SIGNATURE_DEF are not set (tensorflow::kSavedModelTagServe, ...)
DEFAULT_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
#: signatures that are not model functions (the init and train ops TensorFlow stores as signatures)
_NOT_SERVING = ("__saved_model_init_op", "__saved_model_train_op")

#: TensorFlow DataType name → config type (Triton's table, plus DT_BFLOAT16 as TYPE_BF16)
TF_TO_CONFIG = {
    "DT_BOOL": "TYPE_BOOL",
    "DT_UINT8": "TYPE_UINT8",
    "DT_UINT16": "TYPE_UINT16",
    "DT_UINT32": "TYPE_UINT32",
    "DT_UINT64": "TYPE_UINT64",
    "DT_INT8": "TYPE_INT8",
    "DT_INT16": "TYPE_INT16",
    "DT_INT32": "TYPE_INT32",
    "DT_INT64": "TYPE_INT64",
    "DT_HALF": "TYPE_FP16",
    "DT_FLOAT": "TYPE_FP32",
    "DT_DOUBLE": "TYPE_FP64",
    "DT_STRING": "TYPE_STRING",
    "DT_BFLOAT16": "TYPE_BF16",
}
SUPPORTED_CONFIG_TYPES = frozenset(TF_TO_CONFIG.values())


@dataclass(frozen=True)
class Tensor:
    #: the signature's key: the tensor's name in the config and on the wire
    name: str
    #: the graph tensor it feeds or fetches (``TensorInfo.name``)
    graph_name: str
    #: config enum name (``TYPE_FP32``)
    data_type: str
    #: sizes with -1 where unknown; ``[]`` for a scalar or an unknown rank
    shape: list[int]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def batches(self) -> bool:
        """A first dimension of unknown size (Triton's test of whether a tensor can take a batch)."""
        return bool(self.shape) and self.shape[0] == -1


@dataclass(frozen=True)
class Signature:
    key: str
    tag: str
    #: sorted by name (a SignatureDef's maps have no order)
    inputs: list[Tensor]
    outputs: list[Tensor]

    def input(self, name: str) -> Tensor | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> Tensor | None:
        return next((t for t in self.outputs if t.name == name), None)


def shape_text(shape: list[int]) -> str:
    """Triton's ShapeToString: ``[-1,4]``."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def read_saved_model(folder: Path, shown: Path, model: str) -> Any:
    """The ``SavedModel`` message of ``folder`` (a path the loader may open; ``shown`` names it in messages)."""
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    if not folder.is_dir():
        if folder.exists():
            raise ConfigError(f"unable to load model '{model}': '{shown}' is not a folder (a SavedModel is one)")
        raise ConfigError(f"unable to find '{shown}' for model '{model}'")
    saved = saved_model_pb2.SavedModel()
    binary, text = folder / SAVED_MODEL_PB, folder / SAVED_MODEL_PBTXT
    try:
        if binary.is_file():
            saved.ParseFromString(binary.read_bytes())
        elif text.is_file():
            text_format.Parse(text.read_text(encoding="utf-8"), saved)
        else:
            # TensorFlow's own message (tensorflow/cc/saved_model/reader.cc), as Triton passes it on
            raise ConfigError(
                f"unable to load model '{model}': SavedModel file does not exist at: "
                f"{shown}/{{{SAVED_MODEL_PBTXT}|{SAVED_MODEL_PB}}}"
            )
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"unable to load model '{model}': {shown.name}/{SAVED_MODEL_PB} is not a SavedModel: {exc}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"unable to load model '{model}': cannot read {shown}: {exc.strerror or exc}") from None
    return saved


def meta_graph(saved: Any, tag: str, model: str) -> Any:
    """The ``MetaGraphDef`` whose tag set holds ``tag``."""
    for graph in saved.meta_graphs:
        if tag in graph.meta_info_def.tags:
            return graph
    found = ", ".join("{" + ",".join(g.meta_info_def.tags) + "}" for g in saved.meta_graphs) or "none"
    raise ConfigError(
        f"unable to load model '{model}', expected '{tag}' tag (the SavedModel's tag sets: {found}; "
        'set parameters { key: "TF_GRAPH_TAG" ... } to another)'
    )


def signature(graph: Any, key: str, explicit: bool, tag: str, model: str) -> Signature:
    """The signature ``key``. Without TF_SIGNATURE_DEF (``explicit`` false) a SavedModel lacking
    ``serving_default`` serves its other signature, with Triton's warning; a TF_SIGNATURE_DEF that names
    none is refused (Triton would serve another one instead)."""
    defs = graph.signature_def
    serving = sorted(k for k in defs if k not in _NOT_SERVING)
    chosen = key if key in defs else None
    if chosen is None and not explicit and serving:
        chosen = serving[0]
        log.warning("unable to find default serving signature '%s', using signature '%s'", key, chosen)
    if chosen is None:
        where = ", ".join(serving) or "none"
        raise ConfigError(
            f"unable to load model '{model}', expected '{key}' signature (the SavedModel's signatures: {where})"
        )
    definition = defs[chosen]
    return Signature(
        chosen,
        tag,
        [_tensor(n, info, "input", model) for n, info in sorted(definition.inputs.items())],
        [_tensor(n, info, "output", model) for n, info in sorted(definition.outputs.items())],
    )


def _tensor(name: str, info: Any, kind: str, model: str) -> Tensor:
    from tensorflow.core.framework import types_pb2

    dtype = types_pb2.DataType.Name(info.dtype) if info.dtype in types_pb2.DataType.values() else str(info.dtype)
    config_type = TF_TO_CONFIG.get(dtype)
    if config_type is None:
        raise ConfigError(f"unable to process {kind} '{name}' for '{model}', unsupported datatype '{dtype}'")
    shape = info.tensor_shape
    dims = [] if shape.unknown_rank else [int(d.size) for d in shape.dim]
    return Tensor(name, info.name, config_type, dims)
