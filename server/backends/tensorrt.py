"""TensorRT backend: platform ``tensorrt_plan`` / backend ``tensorrt`` (serialized engines, ``model.plan``).

Engines are explicit-batch (TensorRT 10). Each instance owns, on the GPU its instance group names: a
deserialized engine, one execution context, one CUDA stream and device buffers that grow once and are
reused. Why an engine per instance: TensorRT lets only one context use an optimization profile at a
time, so instances sharing an engine would contend for profiles; a private engine costs its weights
once more in GPU memory and never blocks. Inputs and outputs are bound by name. For each batch the
context switches to the tightest optimization profile whose [min, max] shapes contain the batch
(restricted to ``instance_group.profile`` when the config lists profiles).

``tensorrt`` and ``cuda-python`` are imported only when a plan model loads: on a machine without them
the model is UNAVAILABLE with the reason, and the server keeps serving everything else.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from ..config import ConfigError, pb
from ..repository.model_files import pinned
from ..vocabulary.errors import InvalidArgument, Unavailable
from .base import Backend, BackendInstance, InstanceSpec, TensorBackendInstance

INSTALL_HINT = "pip install kubeinfer[gpu]"

#: TensorRT DataType name → config enum name
TRT_TO_CONFIG = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
}

#: (min, opt, max) shape of one input in one optimization profile
ProfileShapes = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def require_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError:
        raise Unavailable(f"tensorrt is not installed: {INSTALL_HINT}") from None
    return tensorrt


def choose_profile(
    profiles: Sequence[ProfileShapes], shapes: dict[str, tuple[int, ...]], allowed: Sequence[int] | None = None
) -> int:
    """Index of the tightest profile (smallest max batch) whose [min, max] contains every input shape."""
    candidates = []
    for index, profile in enumerate(profiles):
        if allowed and index not in allowed:
            continue
        fits = True
        for name, shape in shapes.items():
            if name not in profile:
                continue
            lo, _, hi = profile[name]
            if len(lo) != len(shape) or any(s < a or s > b for s, a, b in zip(shape, lo, hi, strict=True)):
                fits = False
                break
        if fits:
            size = sum(int(np.prod(hi)) for _, _, hi in profile.values())
            candidates.append((size, index))
    if not candidates:
        ranges = "; ".join(
            f"profile {i}: " + ", ".join(f"{n} {list(lo)}..{list(hi)}" for n, (lo, _, hi) in p.items())
            for i, p in enumerate(profiles)
            if not allowed or i in allowed
        )
        got = ", ".join(f"{n} {list(s)}" for n, s in shapes.items())
        raise InvalidArgument(f"input shapes {got} fit no optimization profile of the engine ({ranges})")
    return min(candidates)[1]


class EngineInfo:
    """Names, dtypes, shapes and profiles of an engine's I/O tensors (read once at load)."""

    def __init__(self, engine: Any) -> None:
        trt = require_tensorrt()
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.dtypes: dict[str, np.dtype] = {}
        self.config_types: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(name)
            dtype = engine.get_tensor_dtype(name)
            self.config_types[name] = TRT_TO_CONFIG.get(dtype.name, "TYPE_INVALID")
            self.dtypes[name] = (
                np.dtype(trt.nptype(dtype))
                if dtype.name in TRT_TO_CONFIG and dtype.name != "BF16"
                else np.dtype(np.float32)
            )
            self.shapes[name] = tuple(engine.get_tensor_shape(name))
        self.profiles: list[ProfileShapes] = []
        for p in range(engine.num_optimization_profiles):
            profile: ProfileShapes = {}
            for name in self.inputs:
                if -1 in self.shapes[name]:
                    lo, opt, hi = engine.get_tensor_profile_shape(name, p)
                    profile[name] = (tuple(lo), tuple(opt), tuple(hi))
            self.profiles.append(profile)

    @property
    def batching(self) -> bool:
        """Dynamic first dimension on every input and output: the config's implicit batch dim."""
        return all(self.shapes[n] and self.shapes[n][0] == -1 for n in self.inputs + self.outputs)

    def max_batch_size(self) -> int:
        if not self.batching:
            return 0
        best = 0
        for profile in self.profiles:
            best = max(best, min(hi[0] for _, _, hi in profile.values()) if profile else 0)
        return best


def deserialize(plan: Path, device_id: int) -> Any:
    """Load a serialized engine on ``device_id``."""
    trt = require_tensorrt()
    from .cuda_runtime import check, cudart

    check(cudart().cudaSetDevice(device_id))
    runtime = trt.Runtime(_logger())
    try:
        data = pinned(plan).read_bytes()  # the file the runtime opened for this load
    except OSError as exc:
        raise ConfigError(f"cannot read {plan.name}: {exc}") from None
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise ConfigError(
            f"TensorRT cannot deserialize {plan.name}: plans are specific to the TensorRT version and GPU "
            "they were built with; rebuild it with `kubeinfer convert` on this machine"
        )
    return engine


_LOGGER: Any = None
_LOGGER_LOCK = threading.Lock()


def _logger() -> Any:
    global _LOGGER
    trt = require_tensorrt()
    with _LOGGER_LOCK:
        if _LOGGER is None:
            _LOGGER = trt.Logger(trt.Logger.WARNING)
    return _LOGGER


class EngineRunner:
    """One context + stream + reusable device buffers over one engine; not thread-safe (one per thread)."""

    def __init__(self, engine: Any, device_id: int, allowed_profiles: Sequence[int] | None = None) -> None:
        from .cuda_runtime import DeviceBuffer, Stream

        self.engine = engine
        self.info = EngineInfo(engine)
        self.device_id = device_id
        self.allowed = list(allowed_profiles or [])
        self.stream = Stream(device_id)
        self.context = engine.create_execution_context()
        if self.context is None:
            raise RuntimeError("TensorRT could not create an execution context (out of GPU memory?)")
        self.profile = -1
        self.buffers = {name: DeviceBuffer() for name in self.info.inputs + self.info.outputs}

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        from .cuda_runtime import check, cudart

        check(cudart().cudaSetDevice(self.device_id))
        info = self.info
        missing = [n for n in info.inputs if n not in inputs]
        if missing:
            raise InvalidArgument(f"missing engine input(s): {', '.join(missing)}")
        arrays = {n: np.ascontiguousarray(inputs[n], dtype=info.dtypes[n]) for n in info.inputs}
        if info.profiles and any(info.profiles):
            profile = choose_profile(info.profiles, {n: a.shape for n, a in arrays.items()}, self.allowed)
            if profile != self.profile:
                self.context.set_optimization_profile_async(profile, int(self.stream))
                self.profile = profile
        for name, array in arrays.items():
            if not self.context.set_input_shape(name, array.shape):
                raise InvalidArgument(f"engine input '{name}' does not accept shape {list(array.shape)}")
            ptr = self.buffers[name].ensure(array.nbytes)
            self.stream.h2d(ptr, array)
            self.context.set_tensor_address(name, ptr)
        host: dict[str, np.ndarray] = {}
        for name in info.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            out = np.empty(shape, dtype=info.dtypes[name])
            ptr = self.buffers[name].ensure(out.nbytes)
            self.context.set_tensor_address(name, ptr)
            host[name] = out
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT execution failed (see the server log)")
        wanted = list(output_names) if output_names is not None else info.outputs
        for name in wanted:
            self.stream.d2h(host[name], self.buffers[name].ptr)
        self.stream.synchronize()
        return {n: host[n] for n in wanted}

    def close(self) -> None:
        for buffer in self.buffers.values():
            buffer.free()
        self.stream.destroy()
        self.context = None
        self.engine = None


def _instance_profiles(config: pb.ModelConfig, spec: InstanceSpec) -> list[int]:
    """``instance_group.profile`` of the group this instance came from (empty: every profile)."""
    for gi, group in enumerate(config.instance_group):
        if (group.name or f"{config.name}_{gi}") == spec.name:
            try:
                return [int(p) for p in group.profile]
            except ValueError:
                raise ConfigError(f"instance_group '{spec.name}' profile entries must be integers") from None
    return []


class TensorRTBackend(Backend):
    name: ClassVar[str] = "tensorrt"

    @classmethod
    def _info(cls, config: pb.ModelConfig, version_path: Path) -> EngineInfo:
        plan = cls.model_path(config, version_path)
        device = next((g.gpus[0] for g in config.instance_group if g.gpus), 0)
        return EngineInfo(deserialize(plan, device))

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        require_tensorrt()  # the clear reason comes first, whatever the config holds
        if config.input and config.output and config.HasField("max_batch_size"):
            return
        info = cls._info(config, version_path)
        if not config.HasField("max_batch_size"):
            config.max_batch_size = info.max_batch_size()
            if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        for declared, names in ((config.input, info.inputs), (config.output, info.outputs)):
            known = {t.name for t in declared}
            for name in names:
                if name in known:
                    continue
                t = declared.add()
                t.name = name
                t.data_type = cast(pb.DataType, pb.DataType.Value(info.config_types[name]))
                t.dims.extend(list(info.shapes[name][skip:]) or [1])

    @classmethod
    def validate_model(cls, config: pb.ModelConfig, version_path: Path) -> None:
        info = cls._info(config, version_path)
        if config.max_batch_size > 0 and not info.batching:
            raise ConfigError(
                f"max_batch_size is {config.max_batch_size} but the engine has no dynamic batch dimension; "
                "set max_batch_size: 0 and give the full dims"
            )
        if config.max_batch_size > info.max_batch_size() and info.batching:
            raise ConfigError(
                f"max_batch_size {config.max_batch_size} exceeds the engine's largest optimization profile "
                f"({info.max_batch_size()}); rebuild with a larger --max-batch or lower max_batch_size"
            )
        skip = 1 if config.max_batch_size > 0 else 0
        for kind, declared, names in (("input", config.input, info.inputs), ("output", config.output, info.outputs)):
            for t in declared:
                if t.name not in names:
                    raise ConfigError(f"{kind} '{t.name}' is not in the engine; its {kind}s are {', '.join(names)}")
                want = pb.DataType.Name(t.data_type)
                if info.config_types[t.name] != want:
                    raise ConfigError(
                        f"{kind} '{t.name}' is {info.config_types[t.name]} in the engine but {want} in the config"
                    )
                engine_dims = list(info.shapes[t.name][skip:])
                # with a reshape the engine sees reshape.shape (the runtime reshapes, runtime.reshape)
                field, dims = ("reshape", list(t.reshape.shape)) if t.HasField("reshape") else ("dims", list(t.dims))
                if len(engine_dims) != len(dims) or any(
                    e != -1 and c != -1 and e != c for e, c in zip(engine_dims, dims, strict=True)
                ):
                    raise ConfigError(
                        f"{kind} '{t.name}' has {field} {dims} in the config but {engine_dims} "
                        "in the engine" + (" (without the batch dimension)" if skip else "")
                    )

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        require_tensorrt()
        if spec.kind != "GPU":
            raise ConfigError(
                f"tensorrt_plan models run on GPU instances only; instance '{spec.name}' is {spec.kind} "
                "(use kind: KIND_GPU, or KIND_AUTO on a machine with a GPU)"
            )
        return TensorRTInstance(self.config, self.model_file(), spec)


class TensorRTInstance(TensorBackendInstance):
    def __init__(self, config: pb.ModelConfig, plan: Path, spec: InstanceSpec) -> None:
        engine = deserialize(plan, spec.device_id)
        self.runner = EngineRunner(engine, spec.device_id, _instance_profiles(config, spec))
        self.output_names = [t.name for t in config.output] or list(self.runner.info.outputs)

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        return self.runner.run(inputs, output_names)

    def close(self) -> None:
        self.runner.close()
