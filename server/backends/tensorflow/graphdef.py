"""What a GraphDef file (platform ``tensorflow_graphdef``, ``<version>/model.graphdef``) offers, and the load's
checks of the config against it, as Triton's TensorFlow backend does them (``src/tensorflow.cc``
``graphdef::ValidateTRITONTFModel``, ``src/tensorflow_backend_tf.cc`` ``TRITONTF_ModelCreateFromGraphDef``).

A GraphDef names no inputs or outputs: every ``Placeholder`` node is a potential input and every other node a
potential output, known by name only (Triton's words). The config's tensor names are node names; the session
feeds and fetches the node's first tensor (``<name>:0``, what TensorFlow takes a bare node name for). Nothing
can be auto-completed from it (Triton fills nothing for a GraphDef): the config lists inputs and outputs.
Beyond Triton, an input's ``data_type`` is checked against its placeholder's ``dtype`` at load (Triton fails
every request with TensorFlow's error instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import ConfigError, pb
from ...config.platforms import row_for
from .savedmodel import TF_TO_CONFIG

PLATFORM = "tensorflow_graphdef"
#: Triton's order of sequence controls (``graphdef::ValidateTRITONTFModel``)
_CONTROL_ORDER = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID")


def is_graphdef(config: pb.ModelConfig) -> bool:
    """Whether ``config`` is served from a GraphDef (its platform, or backend "tensorflow" with
    ``default_model_filename: "model.graphdef"``, as Triton's AutoFill reads it)."""
    row = row_for(config)
    return row is not None and row.platform == PLATFORM


@dataclass(frozen=True)
class Graph:
    #: the ``GraphDef`` message
    graph_def: Any
    #: Placeholder node name → its config type (``TYPE_FP32``; "" when its dtype is missing or not served)
    inputs: dict[str, str]
    #: every other node's name
    outputs: frozenset[str]


def read_graph(path: Path, shown: Path, model: str) -> Graph:
    """The GraphDef in the file ``path`` (a path the load may open; ``shown`` names it in messages)."""
    from google.protobuf import message
    from tensorflow.core.framework import graph_pb2, types_pb2

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"unable to find '{shown}' for model '{model}'") from None
    except IsADirectoryError:
        raise ConfigError(f"unable to load model '{model}': '{shown}' is a folder (a GraphDef is one file)") from None
    except OSError as exc:
        raise ConfigError(f"unable to load model '{model}': cannot read {shown}: {exc.strerror or exc}") from None
    graph_def = graph_pb2.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except message.DecodeError:
        # TensorFlow's ReadBinaryProto, as Triton passes it on
        raise ConfigError(f"Can't parse {shown} as binary proto") from None
    if not graph_def.node:
        raise ConfigError(f"model {model} has an empty network")
    inputs: dict[str, str] = {}
    outputs: set[str] = set()
    for node in graph_def.node:
        if node.op == "Placeholder":
            dtype = node.attr["dtype"].type if "dtype" in node.attr else 0
            name = types_pb2.DataType.Name(dtype) if dtype in types_pb2.DataType.values() else ""
            inputs[node.name] = TF_TO_CONFIG.get(name, "")
        else:
            outputs.add(node.name)
    return Graph(graph_def, inputs, frozenset(outputs))


def _control_names(config: pb.ModelConfig) -> list[str]:
    """The sequence controls' tensor names in the order Triton checks them."""
    kind_name = pb.ModelSequenceBatching.Control.Kind.Name
    names = []
    for kind in _CONTROL_ORDER:
        for control in config.sequence_batching.control_input:
            if any(kind_name(c.kind) == kind for c in control.control) and control.name not in names:
                names.append(control.name)
    return names


def validate(config: pb.ModelConfig, graph: Graph) -> None:
    """Triton's ``graphdef::ValidateTRITONTFModel`` with its messages, then (beyond Triton) each input's type."""
    name = config.name
    if len(graph.inputs) < len(config.input):
        raise ConfigError(
            f"unable to load model '{name}', configuration expects {len(config.input)} inputs, model provides at "
            f"most {len(graph.inputs)}"
        )
    if config.HasField("sequence_batching"):
        for control in _control_names(config):
            if control not in graph.inputs:
                raise ConfigError(
                    f"configuration specified sequence control '{control}', but model does not provide that input"
                )
    # CheckAllowedModelInput / CheckAllowedModelOutput (backend_common.cc): the names sorted, ", "-joined
    for kind, declared, allowed in (
        ("input", config.input, graph.inputs.keys()),
        ("output", config.output, graph.outputs),
    ):
        for t in declared:
            if t.name not in allowed:
                raise ConfigError(
                    f"unexpected inference {kind} '{t.name}', allowed {kind}s are: {', '.join(sorted(allowed))}"
                )
    for t in config.input:
        model_type, want = graph.inputs[t.name], pb.DataType.Name(t.data_type)
        if model_type and model_type != want:
            shown = "TYPE_BYTES" if model_type == "TYPE_STRING" else model_type
            raise ConfigError(
                f"unable to load model '{name}', configuration expects datatype {want} for input '{t.name}', model "
                f"provides {shown}"
            )


def placed(graph_def: Any, device: str | None) -> Any:
    """The GraphDef to import for an instance on ``device`` (None: KIND_MODEL, the graph's own placement):
    as Triton, the device of every node not on a CPU is cleared and the instance's device set on every node
    without one (TensorFlow's ``SetDefaultDevice``)."""
    if device is None:
        return graph_def
    import tensorflow as tf

    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        if node.device and not _on_cpu(tf, node.device):
            node.ClearField("device")
        if not node.device:
            node.device = device
    return copy


def _on_cpu(tf: Any, device: str) -> bool:
    try:
        return bool(tf.DeviceSpec.from_string(device).device_type == "CPU")
    except ValueError:
        return False
