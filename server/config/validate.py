"""Checks a ModelConfig the way Triton does, with messages a user can act on.

Pure functions of the config (no model files): the server runs them before loading and the operator
runs them before rendering, so a bad spec is refused with the same words in both places.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from . import model_config_pb2 as pb
from .codec import ConfigError
from .platforms import BUILTIN_BACKENDS, KNOWN_PLATFORMS
from .sequence import check_sequence_batching
from .traffic import parse_traffic
from .version_policy import MIN_NUM_VERSIONS

#: longest file name Linux file systems take (NAME_MAX, in bytes)
MAX_FILE_NAME_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_file_name(value: str, field: str, alternative: str = "") -> None:
    """A file name from a config must name one file inside its folder, never a path.

    The one rule for every file name a config carries (model file, label file, warmup data, a relative
    op library), used by the server (config.pbtxt and the load API's overrides) and the operator
    (InferenceModel specs, mirrored as CEL rules in the CRD): one path component, no leading ``.`` (so
    no ``..`` and no hidden names, which the repository contract reserves for staging), no separators,
    no control characters, at most ``MAX_FILE_NAME_BYTES``. ``alternative`` ends the message with what else the field
    takes (an op library may also be an absolute path).
    """
    problem = ""
    if not value:
        problem = "is empty"
    elif "/" in value or "\\" in value:
        problem = "contains a path separator"
    elif _CONTROL.search(value):
        problem = "contains a control character"
    elif value.startswith("."):
        problem = "starts with '.'"
    elif len(value.encode("utf-8")) > MAX_FILE_NAME_BYTES:
        problem = f"is {len(value.encode('utf-8'))} bytes long (at most {MAX_FILE_NAME_BYTES})"
    if problem:
        shown = value if len(value) <= 80 else value[:80] + "..."
        raise ConfigError(
            f"{field} {shown!r} {problem}: it must be a single file name inside the model's folder "
            f"(no '/', '\\' or control characters, not starting with '.', at most {MAX_FILE_NAME_BYTES} bytes)"
            f"{alternative}"
        )


#: what ``op_library_filename`` takes besides a file name (the end of ``check_file_name``'s message)
OP_LIBRARY_ALTERNATIVE = ", or an absolute path to a library outside the model repository (e.g. one in the image)"


def check_op_library_filename(value: str, field: str = "model_operations op_library_filename") -> None:
    """``model_operations.op_library_filename``: a file name in the model's folder, or an absolute path.

    Triton hands the string to ONNX Runtime unchanged, so a relative one resolves against the server's
    working directory, an accident of how the server was started. Here a relative entry is a single file
    name (``check_file_name``) in the model's folder (the folder holding config.pbtxt, shared by every
    version, as ``label_filename``), and an absolute one (Triton's usual form: a library shipped in the
    server image) is taken as written. Where either leads on disk (symlinks, the repository's other
    models) is checked at load time: ``kubeinfer.server.repository.layout.op_library_path``.
    """
    if value.startswith("/"):
        if _CONTROL.search(value):
            raise ConfigError(f"{field} {value[:80]!r} contains a control character")
        return
    check_file_name(value, field, OP_LIBRARY_ALTERNATIVE)


def check_file_names(config: pb.ModelConfig) -> None:
    """Apply ``check_file_name`` to every file name field of ``config`` that is set."""
    if config.default_model_filename:
        check_file_name(config.default_model_filename, "default_model_filename")
    for arch, filename in config.cc_model_filenames.items():
        check_file_name(filename, f"cc_model_filenames['{arch}']")
    for t in config.output:
        if t.label_filename:
            check_file_name(t.label_filename, f"output '{t.name}' label_filename")
    for warmup in config.model_warmup:
        for name, inp in warmup.inputs.items():
            if inp.input_data_file:
                check_file_name(inp.input_data_file, f"model_warmup '{warmup.name}' input '{name}' input_data_file")
    for state in config.sequence_batching.state:
        for initial in state.initial_state:
            if initial.data_file:
                check_file_name(initial.data_file, f"sequence_batching state '{state.input_name}' data_file")
    for library in config.model_operations.op_library_filename:
        check_op_library_filename(library)


def _check_tensor(kind: str, t: pb.ModelInput | pb.ModelOutput, max_batch_size: int) -> None:
    where = f"{kind} '{t.name}'"
    if not t.name:
        raise ConfigError(f"every {kind} needs a name")
    if t.data_type == pb.TYPE_INVALID:
        raise ConfigError(f"{where} has no data_type (e.g. data_type: TYPE_FP32)")
    for d in t.dims:
        if d == 0 or d < -1:
            raise ConfigError(f"{where} has dims {list(t.dims)}: every dim must be a positive size or -1")
    if not t.dims and not t.HasField("reshape"):
        raise ConfigError(
            f"{where} has no dims; give its shape"
            + (" without the batch dimension (max_batch_size > 0)" if max_batch_size > 0 else "")
        )
    if t.HasField("reshape"):
        _check_reshape(kind, t, max_batch_size)


def _check_reshape(kind: str, t: pb.ModelInput | pb.ModelOutput, max_batch_size: int) -> None:
    """Triton core's reshape rules (``ValidateIOShape``, model_config_utils.cc), its words first, then which
    tensor and why: the same elements in ``dims`` and ``reshape``, variable sizes (-1) in the same number and
    between them the same counts (``[2, 4, -1, 6]`` to ``[8, -1, 1, 6]``); an empty reshape only for a
    one-element ``dims`` of a batching model (a ``[batch]`` tensor)."""
    dims, shape = list(t.dims), list(t.reshape.shape)
    said = f"model {kind} "
    where = f"{kind} '{t.name}' has dims {dims} and reshape {shape}"
    if not shape and max_batch_size == 0:
        raise ConfigError(
            f"{said}cannot have empty reshape for non-batching model: {where}; an empty reshape is a tensor "
            "of the batch dimension alone (max_batch_size > 0)"
        )
    if any(d == 0 or d < -1 for d in shape):
        raise ConfigError(
            f"{said}reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension: {where}"
        )
    if -1 not in dims and -1 not in shape:
        if _count(dims) != _count(shape):
            raise ConfigError(
                f"{said}has different size for dims and reshape: {where}, {_count(dims)} and {_count(shape)} "
                "elements; they must hold the same number of elements"
            )
        return
    if (-1 in dims) != (-1 in shape):
        raise ConfigError(
            f"{said}has different size for dims and reshape: {where}; a variable size (-1) must be in both"
        )
    dim_chunks, shape_chunks = _chunks(dims), _chunks(shape)
    if len(dim_chunks) != len(shape_chunks):
        raise ConfigError(f"{said}has different number of variable-size dimensions for dims and reshape: {where}")
    if dim_chunks != shape_chunks:
        raise ConfigError(
            f"{said}has different size for dims and reshape: {where}; the fixed sizes before, between and after "
            f"the variable ones (-1) must hold the same number of elements ({dim_chunks} and {shape_chunks})"
        )


def _chunks(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed sizes around each -1 (Triton's trunks)."""
    counts, n = [], 1
    for d in dims:
        if d == -1:
            counts.append(n)
            n = 1
        else:
            n *= d
    return counts + [n]


def _count(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _check_dynamic_batching(config: pb.ModelConfig) -> None:
    db = config.dynamic_batching
    for size in db.preferred_batch_size:
        if size <= 0:
            raise ConfigError(f"dynamic_batching.preferred_batch_size {size} must be positive")
        if config.max_batch_size > 0 and size > config.max_batch_size:
            raise ConfigError(
                f"dynamic_batching.preferred_batch_size {size} is larger than max_batch_size {config.max_batch_size}"
            )
    if db.priority_levels:
        if not 1 <= db.default_priority_level <= db.priority_levels:
            raise ConfigError(
                f"dynamic_batching.default_priority_level must be in 1..{db.priority_levels} "
                f"(priority_levels), got {db.default_priority_level}"
            )
    for level in db.priority_queue_policy:
        if not 1 <= level <= db.priority_levels:
            raise ConfigError(
                f"dynamic_batching.priority_queue_policy has level {level}, outside 1..{db.priority_levels}"
            )


def _check_ensemble(config: pb.ModelConfig) -> None:
    if not config.HasField("ensemble_scheduling") or not config.ensemble_scheduling.step:
        raise ConfigError("platform 'ensemble' needs ensemble_scheduling with at least one step")
    produced: dict[str, int] = {}
    for i, step in enumerate(config.ensemble_scheduling.step):
        if not step.model_name:
            raise ConfigError(f"ensemble step {i} has no model_name")
        if step.model_name == config.name:
            raise ConfigError(f"ensemble step {i} calls the ensemble '{config.name}' itself")
        for tensor in step.output_map.values():
            if tensor in produced:
                raise ConfigError(
                    f"ensemble tensor '{tensor}' is produced by step {produced[tensor]} and step {i}; "
                    "each ensemble tensor may be written once"
                )
            produced[tensor] = i
    inputs = {t.name for t in config.input}
    for t in config.output:
        if t.name not in produced:
            raise ConfigError(f"ensemble output '{t.name}' is not produced by any step's output_map")
    for i, step in enumerate(config.ensemble_scheduling.step):
        for tensor in step.input_map.values():
            if tensor not in inputs and tensor not in produced:
                raise ConfigError(
                    f"ensemble step {i} ('{step.model_name}') reads '{tensor}', which is neither an "
                    "ensemble input nor produced by a step"
                )


def validate_config(
    config: pb.ModelConfig,
    model_name: str | None = None,
    available_backends: Iterable[str] | None = None,
) -> None:
    """Raise ConfigError with an actionable message if ``config`` cannot be served."""
    if model_name is not None and config.name and config.name != model_name:
        raise ConfigError(
            f"config name '{config.name}' does not match the model folder name '{model_name}'; they must be equal"
        )
    check_file_names(config)
    backends = set(BUILTIN_BACKENDS) | set(available_backends or ())
    if config.platform and config.platform not in KNOWN_PLATFORMS:
        raise ConfigError(f"unknown platform '{config.platform}': expected one of {', '.join(sorted(KNOWN_PLATFORMS))}")
    if config.backend and config.backend not in backends:
        raise ConfigError(f"unknown backend '{config.backend}': available are {', '.join(sorted(backends))}")
    if config.platform and config.backend:
        expected = KNOWN_PLATFORMS[config.platform]
        if expected and config.backend != expected:
            raise ConfigError(f"platform '{config.platform}' is served by backend '{expected}', not '{config.backend}'")
    if config.max_batch_size < 0:
        raise ConfigError(f"max_batch_size must be >= 0, got {config.max_batch_size}")
    names: set[tuple[str, str]] = set()
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            _check_tensor(kind, t, config.max_batch_size)
            if (kind, t.name) in names:
                raise ConfigError(f"{kind} '{t.name}' is declared twice")
            names.add((kind, t.name))
    policy = config.version_policy
    if policy.HasField("latest") and policy.latest.num_versions < MIN_NUM_VERSIONS:
        raise ConfigError(f"version_policy latest.num_versions must be at least {MIN_NUM_VERSIONS}")
    if policy.HasField("specific"):
        if not policy.specific.versions:
            raise ConfigError("version_policy specific needs at least one version")
        for v in policy.specific.versions:
            if v < 1:
                raise ConfigError(f"version_policy specific lists version {v}; versions are positive")
    for group in config.instance_group:
        if group.count < 0:
            raise ConfigError(f"instance_group '{group.name}' count {group.count} is negative (0 means 1)")
        for gpu in group.gpus:
            if gpu < 0:
                raise ConfigError(f"instance_group '{group.name}' lists gpu {gpu}; device ids are >= 0")
    if config.HasField("dynamic_batching"):
        _check_dynamic_batching(config)
    if config.HasField("sequence_batching"):
        # Triton allows sequence batching without batching (max_batch_size 0): one slot per instance
        check_sequence_batching(config)
    parse_traffic(config)
    if config.platform == "ensemble":
        _check_ensemble(config)
    elif config.HasField("ensemble_scheduling"):
        raise ConfigError('ensemble_scheduling is only valid with platform: "ensemble"')
