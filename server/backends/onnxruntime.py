"""ONNX Runtime backend: platform ``onnxruntime_onnx`` / backend ``onnxruntime``.

Execution provider follows the instance kind (CPU → CPUExecutionProvider; GPU → CUDA, or TensorRT
when ``optimization.execution_accelerators`` names it). ORT releases the GIL during ``run``, so
instances on separate threads execute truly in parallel.

Config ``parameters`` read (as Triton's onnxruntime backend): ``intra_op_thread_count``,
``inter_op_thread_count``, ``execution_mode`` (0 sequential, 1 parallel), ``allow_spinning`` (default 0,
see below). Graph optimization from
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
from typing import Any, ClassVar, cast

import numpy as np

from ..config import ConfigError, pb, sequence
from ..repository.model_files import pinned
from . import settings
from .base import Backend, BackendInstance, InstanceSpec, TensorBackendInstance

# ONNX TensorProto element type → config enum name
_ONNX_TO_CONFIG = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}


def _graph_signature(model_file: Path) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
    """(name, config type, dims with -1 for symbolic) for graph inputs and outputs."""
    import onnx

    try:
        model = onnx.load(str(pinned(model_file)), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, ValueError, OSError...
        raise ConfigError(f"cannot read ONNX model {model_file.name}: {exc}") from None
    initializers = {i.name for i in model.graph.initializer}

    def describe(values: Any) -> list[tuple[str, str, list[int]]]:
        result = []
        for v in values:
            if v.name in initializers:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim]
            result.append((v.name, _ONNX_TO_CONFIG.get(t.elem_type, "TYPE_INVALID"), dims))
        return result

    return describe(model.graph.input), describe(model.graph.output)


class OnnxRuntimeBackend(Backend):
    name: ClassVar[str] = "onnxruntime"
    loads_op_libraries: ClassVar[bool] = True

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        model_file = cls.model_path(config, version_path)
        inputs, outputs = _graph_signature(model_file)
        graph_batches = all(d and d[0] == -1 for _, _, d in inputs + outputs)
        if not config.HasField("max_batch_size"):
            config.max_batch_size = settings.default_max_batch_size(cls.name) if graph_batches else 0
            if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        # the sequence batcher feeds control and state inputs and consumes state outputs itself
        injected = sequence.injected_input_names(config) | sequence.state_output_names(config)
        for declared, found in ((config.input, inputs), (config.output, outputs)):
            known = {t.name: t for t in declared}
            for name, dtype, dims in found:
                if name in injected and name not in known:
                    continue
                t = known.get(name)
                if t is None:
                    if declared is config.input and known:
                        continue  # a partial input list is the user's choice (optional inputs)
                    t = declared.add()
                    t.name = name
                if t.data_type == pb.TYPE_INVALID:
                    t.data_type = cast(pb.DataType, pb.DataType.Value(dtype))
                if not t.dims and not t.HasField("reshape"):
                    t.dims.extend(dims[skip:] or [1])

    @classmethod
    def validate_model(cls, config: pb.ModelConfig, version_path: Path) -> None:
        model_file = cls.model_path(config, version_path)
        inputs, outputs = _graph_signature(model_file)
        for kind, declared, found in (("input", config.input, inputs), ("output", config.output, outputs)):
            graph = {n: (dt, dims) for n, dt, dims in found}
            for t in declared:
                if t.name not in graph:
                    raise ConfigError(
                        f"{kind} '{t.name}' is not in the ONNX model; the model's {kind}s are "
                        f"{', '.join(graph) or 'none'}"
                    )
                dtype, dims = graph[t.name]
                want = pb.DataType.Name(t.data_type)
                if dtype != want:
                    raise ConfigError(f"{kind} '{t.name}' is {dtype} in the ONNX model but {want} in the config")
                if t.HasField("reshape"):
                    continue
                model_dims = dims
                if config.max_batch_size > 0:
                    if not dims or dims[0] not in (-1,):
                        if dims and dims[0] > 0 and dims[0] >= config.max_batch_size:
                            model_dims = dims[1:]
                        else:
                            raise ConfigError(
                                f"{kind} '{t.name}' has shape {dims} in the ONNX model, which has no "
                                f"variable batch dimension; set max_batch_size: 0 and dims: {dims}"
                            )
                    else:
                        model_dims = dims[1:]
                if len(model_dims) != len(t.dims) or any(
                    m != -1 and c != -1 and m != c for m, c in zip(model_dims, t.dims, strict=False)
                ):
                    batch_note = " (without the batch dimension)" if config.max_batch_size > 0 else ""
                    raise ConfigError(
                        f"{kind} '{t.name}' has dims {list(t.dims)} in the config but {model_dims}{batch_note} "
                        "in the ONNX model"
                    )

        declared_inputs = {t.name for t in config.input} | sequence.injected_input_names(config)
        undeclared = [n for n, _, _ in inputs if n not in declared_inputs]
        if undeclared:
            # Triton's onnxruntime backend: "configuration expects N inputs, model provides M"
            raise ConfigError(
                f"unable to load model '{config.name}', configuration expects {len(config.input)} inputs, "
                f"model provides {len(inputs)}: the config lacks {', '.join(undeclared)}"
            )

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        return OnnxRuntimeInstance(self.config, self.model_file(), spec, self.op_libraries)


def _param(config: pb.ModelConfig, key: str) -> str | None:
    p = config.parameters.get(key)
    return p.string_value if p is not None and p.string_value != "" else None


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
    intra = _param(config, "intra_op_thread_count")
    if intra is not None:
        opts.intra_op_num_threads = int(intra)
    elif spec.kind == "CPU":
        opts.intra_op_num_threads = max(1, (os.cpu_count() or 1) // max(spec.total, 1))
    inter = _param(config, "inter_op_thread_count")
    if inter is not None:
        opts.inter_op_num_threads = int(inter)
    if _param(config, "execution_mode") == "1":
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    # ORT's worker threads spin between parallel sections by default; in a server those spinning threads
    # take the cores the event loop, the clients and other instances need, and in a pod they burn its CPU
    # quota. Spinning gains a little on a quiet machine and loses much when other work shares the cores
    # (benchmarks/config_ab.py, benchmarks/results/config-ab-20261201-191545.json; README 'Performance
    # against Triton and MLServer'). Off unless asked for.
    spinning = "1" if _param(config, "allow_spinning") == "1" else "0"
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
