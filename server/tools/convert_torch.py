"""``kubeinfer convert model.pt``: a PyTorch model → ONNX (→ TensorRT), each a new model version with its config.

The source is a TorchScript file or a ``torch.export`` program (``.pt2``, needs ``onnxscript``). Tensor
names, types, dims and ``max_batch_size`` come from the PyTorch model's ``config.pbtxt`` (``--config``, or
the one two folders up when the file sits in a repository as ``<model>/<version>/model.pt``), else from
``--input-shape NAME=DxD`` (inputs ``INPUT__<i>``, outputs ``OUTPUT__<i>``, FP32). The ONNX graph keeps the
config's names and a dynamic batch axis, is written as ``<repository>/<name>/<next version>/model.onnx``
with an ``onnxruntime_onnx`` config, and is run against the PyTorch module on the same inputs: the
largest output difference and the speed of each are printed. With ``--tensorrt`` the ONNX model is
built into a plan as ``<name>_trt`` (or ``--trt-name``) with ``--fp16``/``--int8`` as for ONNX sources,
and compared with the PyTorch module the same way.

  kubeinfer convert models/resnet/1/model.pt --repository models --name resnet_onnx [--tensorrt --fp16]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, config_to_text, load_config_file, pb, validate_config
from ..config.platforms import BY_PLATFORM
from ..repository import confined, publish
from ..repository.layout import CONFIG_FILE
from .convert import ConvertError, error_stats, median_ms, say

ONNX_FILE = BY_PLATFORM["onnxruntime_onnx"].model_filename
TORCH_SUFFIXES = (".pt", ".pt2", ".pth", ".ts", ".torchscript")


def is_torch_source(path: Path) -> bool:
    return path.suffix.lower() in TORCH_SUFFIXES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags for PyTorch sources (the rest are shared with ONNX sources)."""
    group = p.add_argument_group("PyTorch (model.pt / model.pt2) and TensorFlow (model.savedmodel) sources")
    group.add_argument("--config", type=Path, help="the source model's config.pbtxt (default: ../../config.pbtxt)")
    group.add_argument(
        "--opset", type=int, default=17, help="ONNX opset for TorchScript and SavedModel sources (default 17)"
    )
    group.add_argument("--tensorrt", action="store_true", help="also build a TensorRT plan from the ONNX model")
    group.add_argument("--trt-name", help="model name of the TensorRT plan (default <name>_trt)")
    p.set_defaults(version=None)


@dataclass
class TorchConvertOptions:
    source: Path
    repository: Path
    name: str
    config: Path | None = None
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    version: int | None = None
    max_batch: int | None = None
    opset: int = 17
    tensorrt: bool = False
    trt_name: str | None = None
    #: handed to the ONNX → TensorRT build (kubeinfer.server.tools.convert.ConvertOptions)
    trt_args: dict[str, Any] = field(default_factory=dict)
    compare_runs: int = 20


def options_from_args(args: argparse.Namespace) -> TorchConvertOptions:
    from .convert import options_from_args as onnx_options

    explicit_version = args.version
    base = onnx_options(args)  # parses --input-shape and --gpus with the same rules
    return TorchConvertOptions(
        source=args.onnx,
        repository=args.repository,
        name=args.name,
        config=args.config,
        input_shapes=base.input_shapes,
        version=explicit_version,
        max_batch=args.max_batch,
        opset=args.opset,
        tensorrt=args.tensorrt,
        trt_name=args.trt_name,
        trt_args={
            "fp16": base.fp16,
            "int8": base.int8,
            "calibration_data": base.calibration_data,
            "min_batch": base.min_batch,
            "opt_batch": base.opt_batch,
            "workspace_mib": base.workspace_mib,
            "instance_count": base.instance_count,
            "gpus": base.gpus,
            "force": base.force,
        },
    )


# ---- the source model's tensors --------------------------------------------------------------------


def source_config(options: TorchConvertOptions) -> pb.ModelConfig | None:
    """The PyTorch model's config: --config, else ``<model>/config.pbtxt`` when the source is in a repository."""
    path = options.config
    if path is None:
        candidate = options.source.resolve().parent.parent / CONFIG_FILE
        if options.source.resolve().parent.name.isdigit() and candidate.is_file():
            path = candidate
    if path is None:
        return None
    try:
        config = load_config_file(path)
    except (ConfigError, OSError) as exc:
        raise ConvertError(f"cannot read {path}: {exc}") from None
    say(f"tensor names, types and dims from {path}")
    return config


def _sample(config_type: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    from ..vocabulary import datatypes

    dt = datatypes.from_config(config_type)
    if dt.numpy is None or dt.v2 == "BYTES":
        raise ConvertError(f"inputs of type {config_type} cannot be exported to ONNX by this tool")
    if dt.v2 == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dt.numpy.kind in "iu":
        return rng.integers(0, 10, shape).astype(dt.numpy)
    return rng.standard_normal(shape).astype(dt.numpy)


def sample_inputs(
    config: pb.ModelConfig, shapes: dict[str, list[int]], batch: int, seed: int = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = {}
    for t in config.input:
        dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
        given = shapes.get(t.name)
        if given is not None:
            if len(given) != len(dims) or any(d != -1 and g != d for g, d in zip(given, dims, strict=True)):
                raise ConvertError(f"--input-shape {t.name}={'x'.join(map(str, given))} does not match its dims {dims}")
            dims = given
        if -1 in dims:
            raise ConvertError(
                f"input '{t.name}' has dynamic dims {dims}; give them with --input-shape "
                f"{t.name}={'x'.join('N' if d == -1 else str(d) for d in dims)}"
            )
        full = ([batch] if config.max_batch_size > 0 else []) + dims
        inputs[t.name] = _sample(pb.DataType.Name(t.data_type), full, rng)
    return inputs


def config_from_shapes(options: TorchConvertOptions, arguments: list[str]) -> pb.ModelConfig:
    """A config for a source without one: INPUT__<i> FP32 with the --input-shape dims, outputs found later."""
    if not options.input_shapes:
        raise ConvertError(
            "no config.pbtxt next to the model and no --config: give each input's dims without the batch "
            f"dimension, e.g. --input-shape INPUT__0=3x224x224 (forward takes {', '.join(arguments) or 'nothing'})"
        )
    config = pb.ModelConfig(max_batch_size=options.max_batch or 8)
    for i, _ in enumerate(arguments):
        name = f"INPUT__{i}"
        alias = arguments[i]
        dims = options.input_shapes.get(name) or options.input_shapes.get(alias)
        if dims is None:
            raise ConvertError(f"--input-shape is missing for input {name} (argument '{alias}')")
        t = config.input.add(name=name, data_type=pb.TYPE_FP32)
        t.dims.extend(dims)
    options.input_shapes = {t.name: list(t.dims) for t in config.input}
    return config


def complete_outputs(config: pb.ModelConfig, results: list[np.ndarray]) -> None:
    """Outputs OUTPUT__<i> from a trial run when the config has none."""
    from ..vocabulary import datatypes

    if config.output:
        return
    skip = 1 if config.max_batch_size > 0 else 0
    for i, value in enumerate(results):
        t = config.output.add(
            name=f"OUTPUT__{i}", data_type=pb.DataType.Value(datatypes.from_numpy(value.dtype).config)
        )
        t.dims.extend(list(value.shape[skip:]) or [1])


# ---- running both sides ------------------------------------------------------------------------------


def _torch_runner(loaded: Any, order: list[str]) -> Any:
    import torch

    from ..backends.pytorch import dtypes

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            out = loaded.module(*(dtypes.to_tensor(np.array(inputs[n])) for n in order))
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [dtypes.to_numpy(o) for o in outs]

    return run


def _next_version(model_dir: Path) -> int:
    if not model_dir.is_dir():
        return 1
    numbers = [int(p.name) for p in model_dir.iterdir() if p.name.isdigit()]
    return max(numbers, default=0) + 1


def write_version(model_dir: Path, version: int, files: dict[str, Path], config_text: str, force: bool) -> Path:
    """Publish ``files`` as ``model_dir/version`` and then the config (``repository.publish``: staged, fsynced)."""
    version_dir = model_dir / str(version)
    if version_dir.exists() and not force:
        raise ConvertError(f"{version_dir} exists; pass --force to replace version {version}")
    new_model = not model_dir.exists()
    # a new model is staged whole beside the others; a new version inside its model's folder
    with confined.opened(confined.open_root(model_dir.parent if new_model else model_dir)) as parent:
        final = model_dir.name if new_model else str(version)
        staged, staging = publish.stage_dir(parent, final)
        try:
            with confined.opened(staging):
                if new_model:
                    os.mkdir(str(version), 0o755, dir_fd=staging)
                with confined.opened(confined.open_dir(staging, str(version) if new_model else "")) as folder:
                    for file_name, source in files.items():
                        publish.write_file(folder, file_name, source.read_bytes())
                    publish.fsync_dir(folder)
                if new_model:
                    publish.write_file(staging, CONFIG_FILE, config_text)
            publish.publish_dir(parent, staged, parent, final)
        except BaseException:
            publish.remove_tree(parent, staged)
            raise
        if not new_model:
            publish.replace_file(parent, CONFIG_FILE, config_text)
    return version_dir


def onnx_config(source: pb.ModelConfig, name: str) -> pb.ModelConfig:
    """The source config served by onnxruntime: same tensors, batching and instances; no PyTorch parameters."""
    config = pb.ModelConfig()
    config.CopyFrom(source)
    config.name = name
    config.platform = "onnxruntime_onnx"
    config.ClearField("backend")
    config.ClearField("default_model_filename")
    config.ClearField("parameters")
    try:
        validate_config(config, name)
    except ConfigError as exc:
        raise ConvertError(f"rendered ONNX config is invalid: {exc}") from None
    return config


def export_onnx(
    options: TorchConvertOptions,
    loaded: Any,
    inputs: list[str],
    outputs: list[str],
    example: dict[str, np.ndarray],
    batching: bool,
    target: Path,
) -> None:
    import warnings

    import torch

    from ..backends.pytorch import artifact, dtypes

    args = tuple(dtypes.to_tensor(np.array(example[n])) for n in inputs)
    if loaded.format == artifact.EXPORTED:
        try:
            import onnxscript  # noqa: F401
        except ImportError:
            raise ConvertError(
                "converting a torch.export program uses torch.onnx's exporter, which needs onnxscript: "
                "pip install kubeinfer[pytorch]"
            ) from None
        program = torch.export.load(str(options.source))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(program, f=str(target), input_names=inputs, output_names=outputs, dynamo=True)
        return
    axes = {n: {0: "batch"} for n in inputs + outputs} if batching else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated; it is the one for TorchScript
        torch.onnx.export(
            loaded.module,
            args,
            str(target),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=options.opset,
            dynamo=False,
        )


def run(options: TorchConvertOptions) -> dict[str, Any]:
    """Convert, write, compare; returns the report that is also printed."""
    from ..backends.pytorch import artifact, require_torch
    from ..backends.pytorch.naming import bind_inputs, bind_outputs
    from ..repository.layout import check_model_name
    from ..vocabulary.errors import InvalidArgument, Unavailable

    try:
        check_model_name(options.name)
    except InvalidArgument as exc:
        raise ConvertError(str(exc)) from None
    if not options.source.is_file():
        raise ConvertError(f"PyTorch model '{options.source}' not found")
    if not options.repository.is_dir():
        raise ConvertError(f"model repository '{options.repository}' is not a folder")
    try:
        torch = require_torch()
    except Unavailable as exc:
        raise ConvertError(str(exc)) from None
    try:
        loaded = artifact.load(options.source, torch.device("cpu"))
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    sig = loaded.signature
    if sig.dict_input:
        raise ConvertError("forward takes a Dict[str, Tensor]; ONNX export needs tensors as positional arguments")
    config = source_config(options) or config_from_shapes(options, sig.arguments)
    if options.max_batch is not None and config.max_batch_size > 0:
        config.max_batch_size = options.max_batch
    batching = config.max_batch_size > 0
    try:
        input_binding = bind_inputs(options.name, [t.name for t in config.input], sig.arguments)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    order = input_binding.ordered()
    runner = _torch_runner(loaded, order)
    compare_batch = min(config.max_batch_size, 8) if batching else 1
    inputs = sample_inputs(config, options.input_shapes, compare_batch)
    reference_list = runner(inputs)
    complete_outputs(config, reference_list)
    try:
        output_binding = bind_outputs(options.name, [t.name for t in config.output], len(reference_list))
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    by_index = {i: n for n, i in output_binding.positions.items()}
    onnx_outputs = [by_index.get(i, f"unused__{i}") for i in range(len(reference_list))]
    reference = {n: reference_list[i] for n, i in output_binding.positions.items()}

    model_dir = options.repository / options.name
    version = options.version or _next_version(model_dir)
    report: dict[str, Any] = {"onnx": {}, "tensorrt": None}
    with tempfile.TemporaryDirectory(prefix=".convert-", dir=options.repository) as tmp:
        onnx_path = Path(tmp) / ONNX_FILE
        say(f"exporting {options.source} ({loaded.format}) to ONNX")
        export_onnx(
            options,
            loaded,
            order,
            onnx_outputs,
            sample_inputs(config, options.input_shapes, 2 if batching else 1),
            batching,
            onnx_path,
        )
        rendered = onnx_config(config, options.name)
        _check_onnx(rendered, onnx_path)
        report["onnx"] = _compare_onnx(onnx_path, runner, inputs, reference, options.compare_runs)
        version_dir = write_version(
            model_dir, version, {ONNX_FILE: onnx_path}, config_to_text(rendered), bool(options.trt_args.get("force"))
        )
        report["onnx"].update(path=str(version_dir / ONNX_FILE), version=version, batch=compare_batch)
        _print("ONNX", report["onnx"], loaded.format)
        if options.tensorrt:
            report["tensorrt"] = _build_tensorrt(options, config, version_dir / ONNX_FILE, runner, inputs, reference)
            _print("TensorRT", report["tensorrt"], loaded.format)
    return report


def _check_onnx(config: pb.ModelConfig, onnx_path: Path) -> None:
    from ..backends.onnxruntime import OnnxRuntimeBackend

    folder = onnx_path.parent
    try:
        OnnxRuntimeBackend.validate_model(config, folder)
    except ConfigError as exc:
        raise ConvertError(f"the exported ONNX model does not match the config: {exc}") from None


def _compare_onnx(
    onnx_path: Path, runner: Any, inputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], runs: int
) -> dict[str, Any]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = list(reference)
    got = dict(zip(names, session.run(names, inputs), strict=True))
    errors = error_stats(reference, got)
    torch_ms = median_ms(lambda: runner(inputs), runs)
    ort_ms = median_ms(lambda: session.run(names, inputs), runs)
    return {
        "errors": {n: {"max_abs": a, "max_rel": r} for n, (a, r) in errors.items()},
        "source_ms": torch_ms,
        "converted_ms": ort_ms,
        "runtime": "onnxruntime (CPUExecutionProvider)",
    }


def _build_tensorrt(
    options: TorchConvertOptions,
    config: pb.ModelConfig,
    onnx_path: Path,
    runner: Any,
    inputs: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
) -> dict[str, Any]:
    from ..backends.tensorrt import EngineRunner, _logger, require_tensorrt
    from . import convert

    name = options.trt_name or f"{options.name}_trt"
    trt_args = dict(options.trt_args)
    max_batch = config.max_batch_size if config.max_batch_size > 0 else None
    trt_options = convert.ConvertOptions(
        onnx=onnx_path,
        repository=options.repository,
        name=name,
        version=_next_version(options.repository / name),
        max_batch=max_batch,
        input_shapes=dict(options.input_shapes),
        compare=False,
        **trt_args,
    )
    convert.check_options(trt_options)
    sig = convert.read_signature(onnx_path)
    trt_config = convert.render_config(trt_options, sig)
    layout = convert.plan_layout(trt_options)
    plan, cache = convert.build_engine(trt_options, sig, layout)
    convert.write_model(trt_options, layout, plan, cache, config_to_text(trt_config))
    trt = require_tensorrt()
    engine = trt.Runtime(_logger()).deserialize_cuda_engine(plan)
    engine_runner = EngineRunner(engine, trt_options.gpus[0])
    names = list(reference)
    try:
        got = engine_runner.run(inputs, names)
        errors = error_stats(reference, got)
        torch_ms = median_ms(lambda: runner(inputs), options.compare_runs)
        trt_ms = median_ms(lambda: engine_runner.run(inputs, names), options.compare_runs)
    finally:
        engine_runner.close()
    return {
        "errors": {n: {"max_abs": a, "max_rel": r} for n, (a, r) in errors.items()},
        "source_ms": torch_ms,
        "converted_ms": trt_ms,
        "runtime": "TensorRT",
        "path": str(layout.plan),
        "version": trt_options.version,
        "batch": next(iter(inputs.values())).shape[0],
    }


def _print(kind: str, part: dict[str, Any], source_format: str, framework: str = "PyTorch") -> None:
    print(f"wrote {part['path']} (version {part['version']})")
    for name, e in part["errors"].items():
        print(
            f"{kind} output '{name}': max abs difference {e['max_abs']:.3g}, "
            f"max rel difference {e['max_rel']:.3g} vs {source_format}"
        )
    speedup = part["source_ms"] / part["converted_ms"] if part["converted_ms"] > 0 else float("inf")
    print(
        f"{kind} batch {part['batch']}: {framework} ({source_format}, CPU) {part['source_ms']:.3f} ms, "
        f"{part['runtime']} {part['converted_ms']:.3f} ms, speed-up {speedup:.2f}x"
    )
