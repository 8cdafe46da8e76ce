"""ONNX Runtime backend: platform ``onnxruntime_onnx`` / backend ``onnxruntime``.

Execution provider follows the instance kind (CPU → CPUExecutionProvider; GPU → CUDA, or TensorRT
when ``optimization.execution_accelerators`` names it). ORT releases the GIL during ``run``, so
instances on separate threads execute truly in parallel.

Config ``parameters`` read (as Triton's onnxruntime backend): ``intra_op_thread_count``,
``inter_op_thread_count``, ``execution_mode`` (0 sequential, 1 parallel), ``allow_spinning`` (default 0,
see below), parsed by ``backends.parameters`` as the other backends' are. Graph optimization from
``optimization.graph.level``: -1 basic, 1 extended, anything else all (ORT's default).
``model_operations { op_library_filename }``: each library is registered with ORT's
``register_custom_ops_library`` before the session is created (Triton's "Custom Operations"), resolved and
checked by the runtime (``repository.layout.op_library_path``; one from the model's folder is handed over
as a private copy of what was read through the folder's descriptor); one that ORT cannot load fails the
load with the entry and ORT's reason. The model file is opened through the path the runtime pinned for
the load (``repository.model_files.pinned``), and external data resolve against the pinned version folder.
When ``intra_op_thread_count`` is unset, CPU instances split the machine's cores between them so
that ``count: 2`` on 2 cores does not oversubscribe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..config import ConfigError, onnx_rules, pb, sequence
from ..config.onnx_signature import LimitExceeded, Malformed, Tensor, graph_tensors, read_signature
from ..repository.model_files import pinned
from . import settings
from .base import Backend, BackendInstance, InstanceSpec, TensorBackendInstance
from .parameters import count_parameter, string_parameter


def _graph_signature(model_file: Path) -> tuple[list[Tensor], list[Tensor]]:
    """The graph's inputs and outputs as a config sees them (``config.onnx_signature``: the streaming read the
    operator's early check uses too, so a large model's weights are never read here)."""
    try:
        with open(pinned(model_file), "rb") as f:
            return graph_tensors(read_signature(f))
    except (Malformed, LimitExceeded) as exc:
        raise ConfigError(f"cannot read ONNX model {model_file.name}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read ONNX model {model_file.name}: {exc.strerror or exc}") from None


class OnnxRuntimeBackend(Backend):
    name: ClassVar[str] = "onnxruntime"
    loads_op_libraries: ClassVar[bool] = True

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        inputs, outputs = _graph_signature(cls.model_path(config, version_path))
        onnx_rules.complete(config, inputs, outputs, settings.default_max_batch_size(cls.name))

    @classmethod
    def validate_model(cls, config: pb.ModelConfig, version_path: Path) -> None:
        inputs, outputs = _graph_signature(cls.model_path(config, version_path))
        problems = onnx_rules.mismatches(config, inputs, outputs)
        if problems:
            raise ConfigError(problems[0])

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        return OnnxRuntimeInstance(self.config, self.model_file(), spec, self.op_libraries)


def _threads(config: pb.ModelConfig, key: str) -> int | None:
    return count_parameter(config, key, minimum=0, backend="ONNX Runtime")  # 0: ONNX Runtime's own choice


Accelerator = pb.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator


def _accelerator(config: pb.ModelConfig, name: str) -> Accelerator | None:
    for acc in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if acc.name == name:
            return acc
    return None


def session_options_and_providers(
    config: pb.ModelConfig, spec: InstanceSpec, cache_dir: Path, op_libraries: Sequence[Path] = ()
) -> tuple[Any, list[Any]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    for entry, library in zip(config.model_operations.op_library_filename, op_libraries, strict=True):
        try:
            opts.register_custom_ops_library(str(library))
        except Exception as exc:  # ORT's Fail: dlopen's reason, or no RegisterCustomOps in the library
            raise ConfigError(
                f"model_operations op_library_filename '{entry}': onnxruntime cannot load {library}: {exc}"
            ) from None
    intra = _threads(config, "intra_op_thread_count")
    if intra is not None:
        opts.intra_op_num_threads = intra
    elif spec.kind == "CPU":
        opts.intra_op_num_threads = max(1, (os.cpu_count() or 1) // max(spec.total, 1))
    inter = _threads(config, "inter_op_thread_count")
    if inter is not None:
        opts.inter_op_num_threads = inter
    if string_parameter(config, "execution_mode") == "1":
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    # ORT's worker threads spin between parallel sections by default; in a server those spinning threads
    # take the cores the event loop, the clients and other instances need, and in a pod they burn its CPU
    # quota. Spinning gains a little on a quiet machine and loses much when other work shares the cores
    # (benchmarks/config_ab.py, benchmarks/results/config-ab-20261201-191545.json; README 'Performance
    # against Triton and MLServer'). Off unless asked for.
    spinning = "1" if string_parameter(config, "allow_spinning") == "1" else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    level = config.optimization.graph.level
    opts.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    providers: list[Any] = []
    if spec.kind == "GPU":
        trt = _accelerator(config, "tensorrt")
        if trt is not None:
            trt_opts: dict[str, Any] = {
                "device_id": spec.device_id,
                "trt_engine_cache_enable": True,
                "trt_engine_cache_path": str(cache_dir),
            }
            precision = trt.parameters.get("precision_mode", "FP32").upper()
            if precision == "FP16":
                trt_opts["trt_fp16_enable"] = True
            elif precision == "INT8":
                trt_opts["trt_int8_enable"] = True
            if "max_workspace_size_bytes" in trt.parameters:
                trt_opts["trt_max_workspace_size"] = int(trt.parameters["max_workspace_size_bytes"])
            if trt.parameters.get("trt_engine_cache_enable", "true").lower() in ("false", "0"):
                trt_opts["trt_engine_cache_enable"] = False
            providers.append(("TensorrtExecutionProvider", trt_opts))
        providers.append(("CUDAExecutionProvider", {"device_id": spec.device_id}))
    providers.append("CPUExecutionProvider")
    return opts, providers


class OnnxRuntimeInstance(TensorBackendInstance):
    # a session run never calls back into the server
    may_run_on_loop = True

    def __init__(
        self, config: pb.ModelConfig, model_file: Path, spec: InstanceSpec, op_libraries: Sequence[Path] = ()
    ) -> None:
        import onnxruntime as ort

        cache_dir = model_file.parent / ".trt_cache"  # dot-name: invisible to the repository scan
        opts, providers = session_options_and_providers(config, spec, cache_dir, op_libraries)
        if spec.kind == "GPU":
            missing = {p[0] if isinstance(p, tuple) else p for p in providers} - set(ort.get_available_providers())
            if "CUDAExecutionProvider" in missing:
                raise RuntimeError(
                    "instance kind GPU needs onnxruntime-gpu with CUDA (pip install kubeinfer[gpu]); "
                    "this onnxruntime has " + ", ".join(ort.get_available_providers())
                )
            if any(isinstance(p, tuple) and p[0] == "TensorrtExecutionProvider" for p in providers):
                cache_dir.mkdir(exist_ok=True)
        source = pinned(model_file)  # the file the runtime opened for this load
        if source != model_file:
            # external data (ONNX files beside model.onnx) resolve against the version folder the runtime opened
            folder = pinned(model_file.parent, directory=True)
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        try:
            self.session = ort.InferenceSession(str(source), sess_options=opts, providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            hint = ""
            if "is not a registered function/op" in str(exc):
                hint = (
                    " (an operator from a custom-op library: list the library in the config, "
                    'model_operations { op_library_filename: "libcustomops.so" })'
                )
            raise ConfigError(f"onnxruntime cannot load {model_file.name}: {exc}{hint}") from None
        self.batching = config.max_batch_size > 0
        self.output_names = [o.name for o in config.output] or [o.name for o in self.session.get_outputs()]
        # implicit state: the sequence batcher reads the state outputs of every step
        self.output_names += sorted(sequence.state_output_names(config) - set(self.output_names))
        # a config ``reshape`` is applied by the runtime for every backend (``runtime.reshape``): inputs
        # arrive in ``reshape.shape`` and outputs leave in it
        self._string_inputs = {t.name for t in config.input if t.data_type == pb.TYPE_STRING}
        #: nothing to convert on either side (no strings): ``run`` hands the arrays straight through,
        #: without the per-execution conversion work
        self._plain = not self._string_inputs and all(o.type != "tensor(string)" for o in self.session.get_outputs())

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        if self._plain:
            return dict(zip(output_names, self.session.run(output_names, inputs), strict=True))
        feed = {}
        for name, array in inputs.items():
            if name in self._string_inputs:
                array = np.vectorize(_to_str, otypes=[object])(array) if array.size else array
            feed[name] = array
        results = self.session.run(output_names, feed)
        outputs: dict[str, np.ndarray] = {}
        for name, value in zip(output_names, results, strict=True):
            if value.dtype == np.object_ or value.dtype.kind == "U":
                value = np.vectorize(_to_bytes, otypes=[object])(value) if value.size else value.astype(object)
            outputs[name] = value
        return outputs

    def close(self) -> None:
        del self.session


def _to_str(v: Any) -> str:
    return v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else str(v)


def _to_bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8", errors="surrogateescape")
