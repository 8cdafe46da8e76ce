"""The ``pytorch`` backend: platform ``pytorch_libtorch``, ``<version>/model.pt`` (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...config import ConfigError, pb
from ...vocabulary.errors import BackendError, InvalidArgument, Unavailable
from ..base import Backend, BackendInstance, InstanceSpec, TensorBackendInstance
from . import artifact, dtypes
from .naming import DICT_KEY, Binding, bind_inputs, bind_outputs, check_declared
from .parameters import TorchParameters, parse_parameters

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install kubeinfer[pytorch]"


def require_torch() -> Any:
    # PyTorch's CPU kernels run on libgomp, whose idle threads spin before they sleep. In a server that
    # shares its cores (event loop, clients, other instances) the spinning threads take the cores the
    # work needs (benchmarks/pytorch_vs_onnx.py; README 'PyTorch' has the numbers).
    # libgomp reads it once, when torch loads it; a value already set in the environment wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError as exc:
        raise Unavailable(f"torch is not installed: {INSTALL_HINT} ({exc})") from None
    return torch


def _check_tensors(config: pb.ModelConfig) -> None:
    """Data types PyTorch can take, and Triton's one-dimension rule for strings."""
    batching = 1 if config.max_batch_size > 0 else 0
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            name = pb.DataType.Name(t.data_type)
            if not dtypes.supported(name):
                raise ConfigError(f"unsupported datatype {name} for {kind} '{t.name}' for model '{config.name}'")
            if name == dtypes.STRING:
                dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
                if len(dims) + batching > 1:
                    raise ConfigError(
                        f"Triton only supports 1 dimensional List of String as {kind} for '{t.name}' for model "
                        f"'{config.name}': TorchScript passes strings as List[str]"
                        + (" (with max_batch_size > 0 use dims: [ 1 ] reshape: { shape: [ ] })" if batching else "")
                    )


class _ProcessSettings:
    """PyTorch's process-wide knobs: applied when a model asks, with a warning when two models disagree."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[str, tuple[Any, str]] = {}

    def apply(self, key: str, value: Any, model: str, setter: Any) -> None:
        with self._lock:
            previous = self._owners.get(key)
            if previous is not None and previous[0] != value and previous[1] != model:
                log.warning(
                    "%s is process-wide in PyTorch: model '%s' sets %s, replacing %s set by model '%s'",
                    key,
                    model,
                    value,
                    previous[0],
                    previous[1],
                )
            if previous is None or previous[0] != value:
                try:
                    setter(value)
                except RuntimeError as exc:  # set_num_interop_threads after parallel work has started
                    log.warning("model '%s': %s=%s not applied: %s", model, key, value, exc)
                    return
            self._owners[key] = (value, model)


PROCESS = _ProcessSettings()


def apply_process_settings(params: TorchParameters, model: str) -> None:
    torch = require_torch()
    if params.nvfuser is not None:
        log.warning("model '%s': ENABLE_NVFUSER is ignored: PyTorch no longer ships NVFuser", model)
    knobs = (
        ("ENABLE_JIT_EXECUTOR", params.jit_executor, torch._C._jit_set_profiling_executor),
        ("ENABLE_JIT_PROFILING", params.jit_profiling, torch._C._jit_set_profiling_mode),
        ("ENABLE_TENSOR_FUSER", params.tensor_fuser, torch._C._jit_set_texpr_fuser_enabled),
        ("DISABLE_CUDNN", None if params.cudnn is None else not params.cudnn, _set_cudnn_disabled),
        ("INTRA_OP_THREAD_COUNT", params.intra_op_threads, torch.set_num_threads),
        ("INTER_OP_THREAD_COUNT", params.inter_op_threads, torch.set_num_interop_threads),
    )
    for key, value, setter in knobs:
        if value is not None:
            PROCESS.apply(key, value, model, setter)


def default_intra_op_threads(instances: int, model: str) -> None:
    """Without INTRA_OP_THREAD_COUNT anywhere, split the cores between a model's CPU instances.

    The same rule as the onnxruntime backend: ``count: 2`` on 2 cores runs two single-threaded forwards
    side by side instead of four OpenMP threads fighting for two cores. PyTorch's setting is process-wide,
    so the last model loaded without the parameter sets it, and an explicit parameter always wins.
    """
    torch = require_torch()
    with PROCESS._lock:
        if "INTRA_OP_THREAD_COUNT" in PROCESS._owners:
            return
        threads = max(1, (os.cpu_count() or 1) // max(instances, 1))
        if torch.get_num_threads() != threads:
            log.info("model '%s': %d CPU instance(s), PyTorch intra-op threads %d", model, instances, threads)
            torch.set_num_threads(threads)


def _set_cudnn_disabled(disabled: bool) -> None:
    import torch

    torch.backends.cudnn.enabled = not disabled


class PyTorchBackend(Backend):
    name: ClassVar[str] = "pytorch"

    def __init__(self, config: pb.ModelConfig, version_path: Path, version: int, context: Any = None) -> None:
        super().__init__(config, version_path, version, context)
        self.params = parse_parameters(config)
        #: ENABLE_WEIGHT_SHARING: one module per device, shared by that device's instances
        self._shared: dict[str, artifact.LoadedModule] = {}

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's PyTorch backend does not auto-complete (a TorchScript file has no tensor names or types)."""
        require_torch()  # the install hint comes first, whatever the config holds

    @classmethod
    def validate_model(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Checks that need no loaded module; the signature is checked when the first instance loads."""
        require_torch()
        parse_parameters(config)
        check_declared("input", [t.name for t in config.input])
        check_declared("output", [t.name for t in config.output])
        _check_tensors(config)
        artifact.detect_format(cls.model_path(config, version_path))

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        torch = require_torch()
        apply_process_settings(self.params, self.config.name)
        if spec.kind == "CPU" and self.params.intra_op_threads is None and spec.index == 0:
            default_intra_op_threads(spec.total, self.config.name)
        if spec.kind == "GPU":
            if not torch.cuda.is_available() or spec.device_id >= torch.cuda.device_count():
                raise ConfigError(
                    f"instance '{spec.name}' is KIND_GPU on gpu {spec.device_id} but this torch "
                    f"({torch.__version__}) sees {torch.cuda.device_count()} CUDA device(s)"
                )
            device = torch.device("cuda", spec.device_id)
        else:
            device = torch.device("cpu")
        key = str(device)
        loaded = self._shared.get(key) if self.params.weight_sharing else None
        if loaded is None:
            loaded = artifact.load(self.model_file(), device)
            if self.params.weight_sharing:
                self._shared[key] = loaded
        return PyTorchInstance(self.config, loaded, self.params)


class PyTorchInstance(TensorBackendInstance):
    """One module (or a shared one) on one device; ``forward`` runs without the GIL in TorchScript."""

    def __init__(self, config: pb.ModelConfig, loaded: artifact.LoadedModule, params: TorchParameters) -> None:
        import torch

        self.torch = torch
        self.config = config
        self.loaded = loaded
        self.params = params
        self.device = loaded.device
        self.gpu = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.gpu else None
        sig = loaded.signature
        self.inputs: Binding = bind_inputs(config.name, [t.name for t in config.input], sig.arguments, sig.dict_input)
        self.outputs: Binding = bind_outputs(config.name, [t.name for t in config.output], sig.results)
        _check_exported_inputs(config, sig)
        self.output_names = [t.name for t in config.output]
        self.batching = config.max_batch_size > 0
        self._input_types = {t.name: pb.DataType.Name(t.data_type) for t in config.input}
        self._output_types = {t.name: pb.DataType.Name(t.data_type) for t in config.output}
        # a config ``reshape`` (a [batch] string tensor's dims [1] with an empty reshape, too) is applied by the
        # runtime for every backend (``runtime.reshape``): tensors come and go in ``reshape.shape``

    # ---- inputs ------------------------------------------------------------------------------------
    def _argument(self, name: str, array: np.ndarray) -> Any:
        if self._input_types[name] == dtypes.STRING:
            return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.ravel()]
        tensor = dtypes.to_tensor(array)
        if self.gpu:
            tensor = tensor.to(self.device, non_blocking=True)
        return tensor

    def _call(self, inputs: dict[str, np.ndarray]) -> Any:
        module = self.loaded.module
        if self.inputs.convention == DICT_KEY:
            return module({n: self._argument(n, a) for n, a in inputs.items()})
        args: list[Any] = [None] * len(self.inputs.positions)
        for name, array in inputs.items():
            args[self.inputs.positions[name]] = self._argument(name, array)
        return module(*args)

    # ---- outputs -----------------------------------------------------------------------------------
    def _result(self, results: Any, name: str) -> Any:
        if isinstance(results, dict):
            if name not in results:
                raise InvalidArgument(
                    f"output '{name}' is not a key of the dictionary forward() returned "
                    f"({', '.join(map(str, results))})"
                )
            return results[name]
        index = self.outputs.positions[name]
        if index >= len(results):
            raise InvalidArgument(
                f"The output {name} in the model configuration refers to an output index which doesn't exist. "
                f"This model has {len(results)} outputs"
            )
        return results[index]

    def _output(self, name: str, value: Any, rows: int | None) -> np.ndarray:
        want = self._output_types[name]
        array: np.ndarray
        if isinstance(value, list) and want == dtypes.STRING:
            if not all(isinstance(v, str) for v in value):
                raise InvalidArgument(f"output '{name}' must be of type Tensor or List[str].")
            array = np.empty(len(value), dtype=object)
            array[:] = [v.encode("utf-8") for v in value]
        elif isinstance(value, self.torch.Tensor):
            got = dtypes.config_type(value.dtype)
            if got != want:
                raise InvalidArgument(
                    f"configuration expects datatype {want} for output '{name}', model provides {got}"
                )
            if value.dim() == 0:
                raise InvalidArgument(f"output '{name}' is a scalar which is not supported.")
            array = dtypes.to_numpy(value)
        else:
            raise InvalidArgument(f"output '{name}' must be of type Tensor or List[str].")
        if rows is not None and (array.ndim == 0 or array.shape[0] != rows):
            raise InvalidArgument(
                f"output '{name}' has shape {list(array.shape)} for a batch of {rows}: with max_batch_size > 0 "
                "every output's first dimension must be the batch"
            )
        return array

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        torch = self.torch
        rows = next(iter(inputs.values())).shape[0] if self.batching and inputs else None
        grad = torch.inference_mode() if self.params.inference_mode else torch.no_grad()
        stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        # thread-local in PyTorch: set on the instance's own thread before every call, as Triton does
        torch._C._set_graph_executor_optimize(self.params.optimized_execution)
        with grad, stream:
            try:
                raw = self._call(inputs)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise BackendError(f"PyTorch execute failure: {exc}") from None
            if isinstance(raw, (tuple, list)) and not (
                isinstance(raw, list) and raw and all(isinstance(v, str) for v in raw)
            ):
                results: Any = list(raw)
            elif isinstance(raw, dict):
                results = raw
            else:
                results = [raw]
            outputs = {n: self._output(n, self._result(results, n), rows) for n in output_names}
        if self.stream is not None:
            self.stream.synchronize()
            if self.params.cache_cleaning:
                torch.cuda.empty_cache()
        return outputs

    def close(self) -> None:
        self.loaded = None  # type: ignore[assignment]
        if self.gpu and self.params.cache_cleaning:
            self.torch.cuda.empty_cache()


def _check_exported_inputs(config: pb.ModelConfig, sig: artifact.Signature) -> None:
    """torch.export programs record dtypes and shapes: check the config against them at load."""
    if not sig.tensors:
        return
    binding = bind_inputs(config.name, [t.name for t in config.input], sig.arguments, sig.dict_input)
    by_position = {p: n for n, p in binding.positions.items()}
    skip = 1 if config.max_batch_size > 0 else 0
    for index, argument in enumerate(sig.arguments):
        if argument not in sig.tensors or index not in by_position:
            continue
        t = next(t for t in config.input if t.name == by_position[index])
        dtype, shape, top = sig.tensors[argument]
        want = pb.DataType.Name(t.data_type)
        got = dtypes.config_type(dtype)
        if got != want:
            raise ConfigError(
                f"input '{t.name}' is {want} in the config but the exported program's argument '{argument}' is "
                f"{got} ({dtype})"
            )
        if skip:
            if not shape or shape[0] is not None:
                raise ConfigError(
                    f"input '{t.name}': the exported program's argument '{argument}' has shape {shape} with a fixed "
                    f"first dimension, but max_batch_size is {config.max_batch_size}; export with "
                    f"dynamic_shapes={{'{argument}': {{0: torch.export.Dim('batch', max={config.max_batch_size})}}}} "
                    "or set max_batch_size: 0"
                )
            if top is not None and top < config.max_batch_size:
                raise ConfigError(
                    f"input '{t.name}': the exported program accepts batches up to {top} but max_batch_size is "
                    f"{config.max_batch_size}; lower max_batch_size or export with a larger Dim max"
                )
        dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
        model_dims = shape[skip:]
        if len(model_dims) != len(dims) or any(
            m is not None and c != -1 and m != c for m, c in zip(model_dims, dims, strict=False)
        ):
            raise ConfigError(
                f"input '{t.name}' has dims {dims} in the config but the exported program's argument '{argument}' "
                f"has {['?' if m is None else m for m in model_dims]}"
                + (" (without the batch dimension)" if skip else "")
            )
