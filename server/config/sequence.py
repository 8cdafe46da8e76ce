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


Control = pb.ModelSequenceBatching.Control
#: what a control of each kind may carry
_BOOL_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


def control_spec(control: pb.ModelSequenceBatching.Control) -> tuple[str, list[object]]:
    """(config data type name, [false value, true value]) of a START/END/READY control."""
    if control.int32_false_true:
        return "TYPE_INT32", list(control.int32_false_true)
    if control.fp32_false_true:
        return "TYPE_FP32", list(control.fp32_false_true)
    return "TYPE_BOOL", list(control.bool_false_true)


def check_sequence_batching(config: pb.ModelConfig) -> None:
    """Triton's checks of a ``sequence_batching`` section (core/src/model_config_utils.cc,
    sequence_batch_scheduler.cc), with messages that say what to change."""
    from .codec import ConfigError

    sb = config.sequence_batching
    where = f"model '{config.name}'" if config.name else "the model"
    seen: dict[str, str] = {}
    for ci in sb.control_input:
        if not ci.name:
            raise ConfigError(f"sequence_batching.control_input of {where} needs a name")
        if len(ci.control) != 1:
            raise ConfigError(
                f"sequence_batching.control_input '{ci.name}' of {where} must have exactly one control, "
                f"has {len(ci.control)}"
            )
        control = ci.control[0]
        kind = Control.Kind.Name(control.kind)
        if kind in seen:
            raise ConfigError(
                f"sequence batching specifies multiple {kind} tensors for {where}: '{seen[kind]}' and '{ci.name}'"
            )
        seen[kind] = ci.name
        if kind == "CONTROL_SEQUENCE_CORRID":
            dtype = pb.DataType.Name(control.data_type)
            if dtype not in _CORRID_TYPES:
                raise ConfigError(
                    f"sequence batching control '{ci.name}' of {where}: CONTROL_SEQUENCE_CORRID data_type must be "
                    f"one of {', '.join(_CORRID_TYPES)}, got {dtype}"
                )
            continue
        lists = [n for n in ("int32_false_true", "fp32_false_true", "bool_false_true") if getattr(control, n)]
        if len(lists) != 1:
            raise ConfigError(
                f"sequence batching control '{ci.name}' ({kind}) of {where} must specify exactly one of "
                "int32_false_true, fp32_false_true or bool_false_true"
            )
        if len(getattr(control, lists[0])) != 2:
            raise ConfigError(
                f"sequence batching control '{ci.name}' ({kind}) of {where}: {lists[0]} must hold exactly two "
                "values, false then true"
            )
    declared_inputs = {t.name for t in config.input}
    state_inputs: set[str] = set()
    for st in sb.state:
        if not st.input_name or not st.output_name:
            raise ConfigError(f"sequence_batching.state of {where} needs input_name and output_name")
        if st.input_name in state_inputs:
            raise ConfigError(f"State input name '{st.input_name}' specified more than once.")
        state_inputs.add(st.input_name)
        if st.input_name in declared_inputs or st.input_name in seen.values():
            raise ConfigError(
                f"state input '{st.input_name}' of {where} is also a model input or control input; the sequence "
                "batcher supplies it, so it must not be listed in input"
            )
        if st.data_type == pb.TYPE_INVALID:
            raise ConfigError(f"state '{st.input_name}' of {where} has no data_type")
        if not st.dims:
            raise ConfigError(f"state '{st.input_name}' of {where} has no dims")
        if len(st.initial_state) > 1:
            raise ConfigError(
                f"initial_state field for state input '{st.input_name}' must contain exactly one or zero element. "
                f"Found '{len(st.initial_state)}' elements."
            )
        for init in st.initial_state:
            if init.data_type != st.data_type:
                raise ConfigError(
                    f"The data type used for 'initial_state' field of state '{st.input_name}' does not match the "
                    "state data type."
                )
            if not init.name:
                raise ConfigError(
                    f"Field 'name' must be set when using initial_state for state input '{st.input_name}'."
                )
            if len(init.dims) != len(st.dims):
                raise ConfigError(
                    "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for "
                    f"state input '{st.input_name}'. {len(init.dims)} != {len(st.dims)}"
                )
            for i_dim, s_dim in zip(init.dims, st.dims, strict=True):
                if i_dim == -1:
                    raise ConfigError(
                        f"'initial_state' field for state input name '{st.input_name}' contains variable dimensions."
                    )
                if s_dim != -1 and i_dim != s_dim:
                    raise ConfigError(
                        f"'initial_state' dim for input name '{st.input_name}' doesn't match 'state' dim "
                        f"description. {i_dim} != {s_dim}"
                    )
            if init.WhichOneof("state_data") is None:
                raise ConfigError(f"initial_state setting expects state'{st.input_name}' to have state_data set")
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0 or (config.max_batch_size > 0 and size > config.max_batch_size):
                raise ConfigError(
                    f"sequence_batching.oldest.preferred_batch_size {size} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        raise ConfigError("sequence_batching.direct.minimum_slot_utilization must be within 0..1")
