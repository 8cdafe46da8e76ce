"""Triton's config normalisation: the defaults a loaded model's config carries, filled in once.

Every reader of a loaded model's config sees the normalised one: ``GET /v2/models/{m}/config`` (rendered
by ``triton_json``), gRPC ``ModelConfig``, the Python backend's ``initialize(args)["model_config"]``, the
schedulers and the instance pool. It follows triton-inference-server/core ``src/model_config_utils.cc``:

* ``AutoCompleteBackendFields`` (its tail): ``backend`` from a known ``platform`` and back
  (``onnxruntime`` ↔ ``onnxruntime_onnx``, ``tensorrt`` ↔ ``tensorrt_plan``, ``pytorch`` →
  ``pytorch_libtorch``), and ``default_model_filename`` from the platform table (``model.py``,
  ``model.onnx``, ``model.plan``, ``model.pt``); ensembles and third-party backends get neither;
* ``NormalizeModelConfig``: ``version_policy`` ``latest { num_versions: 1 }`` when absent;
  ``dynamic_batching.preferred_batch_size`` = ``[max_batch_size]`` when empty (and batching);
  ``sequence_batching.max_sequence_idle_microseconds`` = 1000000 when 0, ``oldest.preferred_batch_size``
  as for the dynamic batcher; ``optimization.{input,output}_pinned_memory.enable`` = true unless set
  (not for ensembles);
* ``NormalizeInstanceGroup`` (not for ensembles): no ``instance_group`` → one group named after the
  model; a group without a name is ``<model>_<index>``; ``KIND_AUTO`` becomes ``KIND_GPU`` when GPUs are
  visible and every listed gpu exists, else ``KIND_CPU``; ``count`` < 1 becomes 1, or 2 for
  ``onnxruntime`` (and TensorFlow) ``KIND_CPU`` groups (``SetDefaultInstanceCount``); a ``KIND_GPU``
  group without ``gpus`` gets every visible GPU;
* ``ValidateInstanceGroup`` after it, with Triton's messages (``check_instance_groups``);
* an ensemble's ``model_transaction_policy`` is present (Triton sets ``decoupled`` from its steps);
* ``max_batch_size`` is explicit (0 when the config and auto-complete left it unset; kubeinfer's schema
  keeps presence until auto-complete has run, Triton's has none).

Evidence, field by field: real Triton 2.51 (the ``tritonserver`` binary of the nvidia-pytriton 0.7.0
wheel, python backend, CPU only) served the configs in tests/support/config_parity/models; its HTTP and
gRPC answers and the ``model_config`` its Python stub got are recorded beside them (``triton-2.51/``)
and tests/integration/test_config_parity.py serves the same folder here and compares every field and
byte. Configs seen there: a bare python model; batching with three unnamed/named/count-0 groups,
KIND_AUTO, ``specific`` policy and reshape; dynamic batching with priorities, queue policies and
``input_pinned_memory`` off; direct and oldest sequence batching with controls, state and an initial
state; KIND_MODEL with a decoupled policy and ``all`` versions; warm-up; a file named by
``default_model_filename``; platform/backend detection for ONNX, PyTorch and TensorRT (served there by
Python-based stand-in backends of those names, which is why Triton's record says ``runtime:
"model.py"`` for them; C++ backends leave ``runtime`` empty, core ``TritonModel::
GetBackendLibraryProperties``); two ensembles. Not reproducible on that CPU-only binary: GPU kinds
(the rules above are the source's), a real ensemble of decoupled steps (kubeinfer's ensembles run
non-decoupled steps only, so ``decoupled`` stays as written).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import model_config_pb2 as pb
from .codec import ConfigError
from .platforms import BY_PLATFORM, TABLE, row_for
from .version_policy import DEFAULT_NUM_VERSIONS

#: Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS (core/src/constants.h)
SEQUENCE_IDLE_DEFAULT_US = 1_000_000
#: backends whose KIND_CPU groups default to two instances (core SetDefaultInstanceCount)
_TWO_CPU_INSTANCES = ("onnxruntime", "tensorflow")
#: Triton's --min-supported-compute-capability default, as its messages print it (std::to_string)
_MIN_COMPUTE_CAPABILITY = "6.000000"
_BY_BACKEND = {p.backend: p for p in TABLE if p.backend}

KIND_AUTO = pb.ModelInstanceGroup.KIND_AUTO
KIND_GPU = pb.ModelInstanceGroup.KIND_GPU
KIND_CPU = pb.ModelInstanceGroup.KIND_CPU
KIND_MODEL = pb.ModelInstanceGroup.KIND_MODEL


def normalize_config(config: pb.ModelConfig, gpus: Sequence[int] = ()) -> None:
    """Fill in ``config`` (in place) as Triton normalises a model's config at load; ``gpus`` are the
    visible GPU ids. Idempotent. Raises ConfigError (Triton's text) for instance groups it cannot place."""
    _fill_backend_fields(config)
    if not config.HasField("max_batch_size"):
        config.max_batch_size = 0
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = DEFAULT_NUM_VERSIONS
    if config.HasField("dynamic_batching") and not config.dynamic_batching.preferred_batch_size:
        if config.max_batch_size > 0:
            config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and config.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("ensemble_scheduling"):
        config.model_transaction_policy.SetInParent()
        return
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    _normalize_instance_groups(config, list(gpus))
    check_instance_groups(config, gpus)


def _fill_backend_fields(config: pb.ModelConfig) -> None:
    """The end of core ``AutoCompleteBackendFields``: the other half of platform/backend, the file name."""
    row = BY_PLATFORM.get(config.platform) if config.platform else None
    if not config.backend and row is not None and row.backend:
        config.backend = row.backend
    known = row_for(config) if config.backend in _BY_BACKEND else None  # tensorflow: SavedModel or GraphDef
    if known is None:
        return  # ensembles, third-party backends: Triton fills nothing
    if not config.platform and known.platform:
        config.platform = known.platform
    if not config.default_model_filename:
        config.default_model_filename = known.model_filename


def _normalize_instance_groups(config: pb.ModelConfig, gpus: list[int]) -> None:
    if not config.instance_group:
        # the backends' preferred groups (python, tensorrt: KIND_GPU when there is a GPU; onnxruntime,
        # pytorch: none) all come to what KIND_AUTO resolves to below
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == KIND_AUTO:
            on_gpu = bool(gpus) and all(g in gpus for g in group.gpus)
            group.kind = KIND_GPU if on_gpu else KIND_CPU
        if group.count < 1:
            cpu_pair = group.kind == KIND_CPU and config.backend in _TWO_CPU_INSTANCES
            group.count = 2 if cpu_pair else 1
        if group.kind == KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def check_instance_groups(config: pb.ModelConfig, gpus: Sequence[int]) -> None:
    """Triton's ``ValidateInstanceGroup`` on a normalised config, with its messages."""
    if config.HasField("ensemble_scheduling"):
        return
    if not config.instance_group:
        raise ConfigError(f"must specify one or more 'instance group's for {config.name}")
    for group in config.instance_group:
        where = f"instance group {group.name} of model {config.name}"
        if group.kind == KIND_MODEL:
            if group.gpus:
                raise ConfigError(f"{where} has kind KIND_MODEL but specifies one or more GPUs")
        elif group.kind == KIND_GPU:
            if not group.gpus:
                if not gpus:
                    raise ConfigError(f"{where} has kind KIND_GPU but no GPUs are available")
                raise ConfigError(f"{where} has kind KIND_GPU but specifies no GPUs")
            for gid in group.gpus:
                if gid not in gpus:
                    raise ConfigError(
                        f"{where} specifies invalid or unsupported gpu id {gid}. GPUs with at least the minimum "
                        f"required CUDA compute compatibility of {_MIN_COMPUTE_CAPABILITY} are: "
                        + ", ".join(str(g) for g in gpus)
                    )
        elif group.kind == KIND_CPU:
            if group.gpus:
                raise ConfigError(f"{where} has kind KIND_CPU but specifies one or more GPUs")
        else:
            raise ConfigError(f"{where} has unexpected kind KIND_AUTO")
        if config.platform != "tensorrt_plan" and group.profile:
            raise ConfigError(
                f"{where} and platform {config.platform}specifies profile field which is only supported for "
                "TensorRT models"
            )
