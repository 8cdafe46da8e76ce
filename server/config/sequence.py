"""Facts about ``sequence_batching`` that both the batcher and the backends' auto-complete need.

Control inputs (``CONTROL_SEQUENCE_START/END/READY/CORRID``) and implicit-state tensors are model
inputs and outputs that the sequence batcher supplies and consumes; clients never send them, so they
are not part of the config's ``input``/``output`` lists (Triton: docs/user_guide/architecture.md
"Stateful Models", docs/user_guide/implicit_state_management.md).
"""

from __future__ import annotations

from . import model_config_pb2 as pb


def control_input_names(config: pb.ModelConfig) -> set[str]:
    if not config.HasField("sequence_batching"):
        return set()
    return {c.name for c in config.sequence_batching.control_input}


def state_input_names(config: pb.ModelConfig) -> set[str]:
    if not config.HasField("sequence_batching"):
        return set()
    return {s.input_name for s in config.sequence_batching.state}


def state_output_names(config: pb.ModelConfig) -> set[str]:
    if not config.HasField("sequence_batching"):
        return set()
    return {s.output_name for s in config.sequence_batching.state}


def injected_input_names(config: pb.ModelConfig) -> set[str]:
    """Model inputs the sequence batcher provides (controls and input states)."""
    return control_input_names(config) | state_input_names(config)
