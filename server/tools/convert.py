"""Convert an ONNX model into a TensorRT plan inside a model repository.

Writes ``<repo>/<model>/<version>/model.plan`` and a matching ``<repo>/<model>/config.pbtxt``
(platform tensorrt_plan, GPU instances, dynamic batching), staged and renamed as the repository's
atomic-write contract asks. With ``--int8`` the entropy calibration cache is written next to the plan
(``calibration.cache``) and reused by the next build. After the build the engine runs against
onnxruntime on the same inputs and the max abs/rel error and the speed-up are printed.

Example:
  kubeinfer convert model.onnx --repository models --name resnet --fp16 --max-batch 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, config_to_text, pb, validate_config
from ..config.platforms import BY_PLATFORM
from ..repository import confined, publish
from ..repository.layout import CONFIG_FILE

PLAN_FILE = BY_PLATFORM["tensorrt_plan"].model_filename
CALIBRATION_CACHE = "calibration.cache"


class ConvertError(ValueError):
    """Bad arguments or an unusable model; the message says what to change."""


@dataclass
class ConvertOptions:
    onnx: Path
    repository: Path
    name: str
    version: int = 1
    fp16: bool = False
    int8: bool = False
    calibration_data: Path | None = None
    min_batch: int | None = None
    opt_batch: int | None = None
    max_batch: int | None = None
    workspace_mib: int = 1024
    #: dims (without the batch dimension) for inputs whose non-batch dims are dynamic
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    instance_count: int = 1
    gpus: list[int] = field(default_factory=lambda: [0])
    force: bool = False
    compare: bool = True
    compare_runs: int = 20


@dataclass(frozen=True)
class Signature:
    """ONNX graph inputs/outputs as (name, config data type, dims with -1 for symbolic)."""

    inputs: list[tuple[str, str, list[int]]]
    outputs: list[tuple[str, str, list[int]]]

    @property
    def batching(self) -> bool:
        return all(d and d[0] == -1 for _, _, d in self.inputs)


@dataclass(frozen=True)
class Layout:
    model_dir: Path
    version_dir: Path
    plan: Path
    config: Path
    calibration_cache: Path


# ---- pure: arguments, shapes, config, layout ---------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "onnx", type=Path, help="the model to convert: model.onnx, model.pt/.pt2 or a model.savedmodel folder"
    )
    p.add_argument("--repository", type=Path, required=True, help="model repository folder")
    p.add_argument("--name", required=True, help="model name (the folder under the repository)")
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--fp16", action="store_true", help="allow FP16 kernels")
    p.add_argument("--int8", action="store_true", help="allow INT8 kernels (needs --calibration-data)")
    p.add_argument(
        "--calibration-data", type=Path, help=".npy [N, ...] for a single-input model, or .npz keyed by input name"
    )
    p.add_argument("--min-batch", type=int, help="optimization profile: smallest batch (default 1)")
    p.add_argument("--opt-batch", type=int, help="optimization profile: batch to tune for (default --max-batch)")
    p.add_argument("--max-batch", type=int, help="optimization profile: largest batch (default 8)")
    p.add_argument("--workspace", type=int, default=1024, metavar="MIB", help="builder workspace limit in MiB")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=DxDxD",
        help="dims without batch for an input with dynamic non-batch dims; repeatable",
    )
    p.add_argument("--instance-count", type=int, default=1, help="instances per GPU in the rendered config")
    p.add_argument("--gpus", default="0", help="comma-separated GPU ids for the instance group")
    p.add_argument("--force", action="store_true", help="replace an existing version")
    p.add_argument("--no-compare", action="store_true", help="skip the accuracy/speed comparison")


def options_from_args(args: argparse.Namespace) -> ConvertOptions:
    shapes: dict[str, list[int]] = {}
    for item in args.input_shape:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise ConvertError(f"--input-shape '{item}' must look like NAME=3x224x224") from None
    try:
        gpus = [int(g) for g in str(args.gpus).split(",") if g.strip()]
    except ValueError:
        raise ConvertError(f"--gpus '{args.gpus}' must be comma-separated integers") from None
    return ConvertOptions(
        onnx=args.onnx,
        repository=args.repository,
        name=args.name,
        version=1 if args.version is None else args.version,  # PyTorch sources default to the next free one
        fp16=args.fp16,
        int8=args.int8,
        calibration_data=args.calibration_data,
        min_batch=args.min_batch,
        opt_batch=args.opt_batch,
        max_batch=args.max_batch,
        workspace_mib=args.workspace,
        input_shapes=shapes,
        instance_count=args.instance_count,
        gpus=gpus,
        force=args.force,
        compare=not args.no_compare,
    )


def check_options(options: ConvertOptions) -> None:
    """Argument checks that need no model: fail before anything slow starts."""
    from ..repository.layout import check_model_name
    from ..vocabulary.errors import InvalidArgument

    try:
        check_model_name(options.name)
    except InvalidArgument as exc:
        raise ConvertError(str(exc)) from None
    if not options.onnx.is_file():
        raise ConvertError(f"ONNX model '{options.onnx}' not found")
    if not options.repository.is_dir():
        raise ConvertError(f"model repository '{options.repository}' is not a folder")
    if options.version < 1:
        raise ConvertError(f"--version must be >= 1, got {options.version}")
    if options.workspace_mib < 1:
        raise ConvertError(f"--workspace must be at least 1 MiB, got {options.workspace_mib}")
    if options.instance_count < 1:
        raise ConvertError(f"--instance-count must be >= 1, got {options.instance_count}")
    if not options.gpus or any(g < 0 for g in options.gpus):
        raise ConvertError(f"--gpus must list device ids >= 0, got {options.gpus}")
    for flag, value in (
        ("--min-batch", options.min_batch),
        ("--opt-batch", options.opt_batch),
        ("--max-batch", options.max_batch),
    ):
        if value is not None and value < 1:
            raise ConvertError(f"{flag} must be >= 1, got {value}")
    lo, opt, hi = batch_range(options)
    if not lo <= opt <= hi:
        raise ConvertError(f"batch sizes must satisfy --min-batch <= --opt-batch <= --max-batch, got {lo}, {opt}, {hi}")
    if options.int8 and options.calibration_data is None:
        raise ConvertError("--int8 needs --calibration-data (a .npy or .npz of representative inputs)")
    if options.calibration_data is not None:
        if not options.int8:
            raise ConvertError("--calibration-data is only used with --int8")
        if not options.calibration_data.is_file():
            raise ConvertError(f"calibration data '{options.calibration_data}' not found")
        if options.calibration_data.suffix not in (".npy", ".npz"):
            raise ConvertError("calibration data must be a .npy or .npz file")
    layout = plan_layout(options)
    if layout.plan.exists() and not options.force:
        raise ConvertError(f"{layout.plan} exists; pass --force to replace version {options.version}")


def batch_range(options: ConvertOptions) -> tuple[int, int, int]:
    hi = options.max_batch if options.max_batch is not None else max(8, options.opt_batch or 1, options.min_batch or 1)
    lo = options.min_batch if options.min_batch is not None else 1
    opt = options.opt_batch if options.opt_batch is not None else hi
    return lo, opt, hi


def read_signature(onnx_path: Path) -> Signature:
    from ..backends.onnxruntime import _graph_signature

    try:
        inputs, outputs = _graph_signature(onnx_path)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    return Signature(inputs, outputs)


def profile_shapes(options: ConvertOptions, sig: Signature) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """(min, opt, max) full shapes per input for the one optimization profile; checks the model's dims."""
    batch_flags = any(v is not None for v in (options.min_batch, options.opt_batch, options.max_batch))
    if not sig.batching and batch_flags:
        first = ", ".join(f"{n} {d}" for n, _, d in sig.inputs)
        raise ConvertError(
            f"the model has no dynamic batch dimension ({first}); drop --min-batch/--opt-batch/--max-batch "
            "or export the ONNX model with a dynamic first axis"
        )
    unknown = set(options.input_shapes) - {n for n, _, _ in sig.inputs}
    if unknown:
        raise ConvertError(
            f"--input-shape names unknown input(s) {', '.join(sorted(unknown))}; "
            f"the model's inputs are {', '.join(n for n, _, _ in sig.inputs)}"
        )
    lo, opt, hi = batch_range(options)
    shapes = {}
    for name, _, dims in sig.inputs:
        item = dims[1:] if sig.batching else dims
        given = options.input_shapes.get(name)
        if given is not None:
            if len(given) != len(item) or any(d != -1 and g != d for g, d in zip(given, item, strict=True)):
                raise ConvertError(
                    f"--input-shape {name}={'x'.join(map(str, given))} does not match the "
                    f"model's dims {item}" + (" (without the batch dimension)" if sig.batching else "")
                )
            if any(g < 1 for g in given):
                raise ConvertError(f"--input-shape {name} dims must be positive")
            item = given
        if -1 in item:
            raise ConvertError(
                f"input '{name}' has dynamic dims {item}; give them with --input-shape "
                f"{name}={'x'.join('N' if d == -1 else str(d) for d in item)}"
            )
        if sig.batching:
            shapes[name] = ([lo, *item], [opt, *item], [hi, *item])
        else:
            shapes[name] = (list(item), list(item), list(item))
    return shapes


def render_config(options: ConvertOptions, sig: Signature) -> pb.ModelConfig:
    """The config.pbtxt that serves the plan, built with the one ModelConfig schema and validated."""
    shapes = profile_shapes(options, sig)
    _, _, hi = batch_range(options)
    config = pb.ModelConfig(name=options.name, platform="tensorrt_plan")
    config.max_batch_size = hi if sig.batching else 0
    skip = 1 if sig.batching else 0
    for name, dtype, _ in sig.inputs:
        t = config.input.add(name=name, data_type=pb.DataType.Value(dtype))
        t.dims.extend(shapes[name][2][skip:])
    for name, dtype, dims in sig.outputs:
        out = config.output.add(name=name, data_type=pb.DataType.Value(dtype))
        out.dims.extend(dims[skip:] or [1])
    if config.max_batch_size > 1:
        config.dynamic_batching.SetInParent()
    config.instance_group.add(count=options.instance_count, kind=pb.ModelInstanceGroup.KIND_GPU, gpus=options.gpus)
    try:
        validate_config(config, options.name)
    except ConfigError as exc:
        raise ConvertError(f"rendered config is invalid: {exc}") from None
    return config


def plan_layout(options: ConvertOptions) -> Layout:
    model_dir = options.repository / options.name
    version_dir = model_dir / str(options.version)
    return Layout(
        model_dir, version_dir, version_dir / PLAN_FILE, model_dir / CONFIG_FILE, version_dir / CALIBRATION_CACHE
    )


def error_stats(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Per output: (max |diff|, max |diff| / max |reference|)."""
    stats = {}
    for name, ref in reference.items():
        got = candidate[name]
        if got.shape != ref.shape:
            raise ConvertError(
                f"output '{name}' has shape {list(got.shape)} from TensorRT but {list(ref.shape)} from onnxruntime"
            )
        ref64 = ref.astype(np.float64)
        diff = np.abs(got.astype(np.float64) - ref64)
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(ref64).max()) if ref64.size else 0.0
        stats[name] = (max_abs, max_abs / scale if scale > 0 else max_abs)
    return stats


def load_calibration(path: Path, sig: Signature) -> dict[str, np.ndarray]:
    """Calibration samples per input, each [N, ...] (batching models) in the model's dtype."""
    from ..vocabulary import datatypes

    if path.suffix == ".npz":
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    else:
        if len(sig.inputs) != 1:
            raise ConvertError("a .npy calibration set serves single-input models; use .npz keyed by input name")
        arrays = {sig.inputs[0][0]: np.load(path)}
    out = {}
    for name, dtype, dims in sig.inputs:
        if name not in arrays:
            raise ConvertError(f"calibration data has no array for input '{name}'")
        numpy_type = datatypes.from_config(dtype).numpy
        out[name] = arrays[name].astype(numpy_type, copy=False)
        item = dims[1:] if sig.batching else dims
        if out[name].ndim != len(item) + 1:
            raise ConvertError(
                f"calibration data for '{name}' has shape {list(out[name].shape)}; expected "
                f"[N, {', '.join(map(str, item))}]"
            )
    counts = {len(a) for a in out.values()}
    if len(counts) != 1:
        raise ConvertError("calibration arrays must all hold the same number of samples")
    return out


# ---- effects: build, write, compare ---------------------------------------------------------------


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _progress_monitor(trt: Any) -> Any:
    """Prints TensorRT's build phases (TensorRT >= 10 has IProgressMonitor)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.depth: dict[str, int] = {}
            self.steps: dict[str, int] = {}

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.depth[phase_name] = self.depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self.steps[phase_name] = num_steps
            if self.depth[phase_name] <= 1:
                _say(f"  {'  ' * self.depth[phase_name]}{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True

        def phase_finish(self, phase_name: str) -> None:
            self.depth.pop(phase_name, None)

    return Monitor()


def _calibrator(
    trt: Any, samples: dict[str, np.ndarray], batch: int, batching: bool, cache: Path, device_id: int
) -> Any:
    from ..backends.cuda_runtime import DeviceBuffer, Stream

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.stream = Stream(device_id)
            self.buffers = {n: DeviceBuffer() for n in samples}
            self.index = 0
            self.total = len(next(iter(samples.values())))
            self.written: bytes | None = None

        def get_batch_size(self) -> int:
            return batch

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self.index + batch > self.total:
                return None
            pointers = []
            for name in names:
                rows = samples[name][self.index : self.index + batch] if batching else samples[name][self.index]
                chunk = np.ascontiguousarray(rows)
                ptr = self.buffers[name].ensure(chunk.nbytes)
                self.stream.h2d(ptr, chunk)
                self.stream.synchronize()
                pointers.append(ptr)
            self.index += batch
            _say(f"  calibration batch {self.index // batch}/{self.total // batch}")
            return pointers

        def read_calibration_cache(self) -> bytes | None:
            if cache.is_file():
                _say(f"  reusing calibration cache {cache}")
                return cache.read_bytes()
            return None

        def write_calibration_cache(self, data: Any) -> None:
            self.written = bytes(data)

    return EntropyCalibrator()


def build_engine(options: ConvertOptions, sig: Signature, layout: Layout) -> tuple[bytes, bytes | None]:
    """Build the serialized engine; returns (plan, calibration cache or None)."""
    from ..backends.tensorrt import _logger, require_tensorrt
    from ..vocabulary.errors import Unavailable

    try:
        trt = require_tensorrt()
    except Unavailable as exc:
        raise ConvertError(str(exc)) from None
    shapes = profile_shapes(options, sig)
    logger = _logger()
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH") and int(trt.__version__.split(".")[0]) < 10:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    _say(f"parsing {options.onnx}")
    if not parser.parse_from_file(str(options.onnx)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ConvertError(f"TensorRT cannot parse {options.onnx.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    monitor = _progress_monitor(trt)
    if monitor is not None:
        config.progress_monitor = monitor
    if options.fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    calibrator = None
    if options.int8:
        assert options.calibration_data is not None
        samples = load_calibration(options.calibration_data, sig)
        _, opt_batch, _ = batch_range(options)
        batch = opt_batch if sig.batching else 1
        count = len(next(iter(samples.values())))
        if count < batch:
            raise ConvertError(
                f"calibration data holds {count} samples; INT8 calibration needs at least one "
                f"batch of --opt-batch ({batch})"
            )
        calibrator = _calibrator(trt, samples, batch, sig.batching, layout.calibration_cache, options.gpus[0])
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = calibrator
        config.set_calibration_profile(profile)
    precision = "+".join(p for p, on in (("FP16", options.fp16), ("INT8", options.int8)) if on) or "FP32"
    _say(f"building {precision} engine (batch {'..'.join(map(str, batch_range(options)[::2]))}); this can take minutes")
    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ConvertError("TensorRT failed to build the engine (see the messages above)")
    _say(f"built in {time.monotonic() - started:.1f}s")
    cache = calibrator.written if calibrator is not None else None
    if cache is None and options.int8 and layout.calibration_cache.is_file():
        cache = layout.calibration_cache.read_bytes()
    return bytes(serialized), cache


def write_model(options: ConvertOptions, layout: Layout, plan: bytes, cache: bytes | None, config_text: str) -> None:
    """Stage under dot-names, fsync and rename into place (``repository.publish``); the config is replaced last."""
    with confined.opened(confined.open_root(options.repository)) as repo:
        if not confined.exists(repo, options.name):
            staged, staging = publish.stage_dir(repo, options.name)
            try:
                with confined.opened(staging):
                    os.mkdir(str(options.version), 0o755, dir_fd=staging)
                    with confined.opened(confined.open_dir(staging, str(options.version))) as folder:
                        _write_version(folder, plan, cache)
                    publish.write_file(staging, CONFIG_FILE, config_text)
                publish.publish_dir(repo, staged, repo, options.name)
            except BaseException:
                publish.remove_tree(repo, staged)
                raise
            return
        with confined.opened(confined.open_dir(repo, options.name)) as model:
            staged, staging = publish.stage_dir(model, str(options.version))
            try:
                with confined.opened(staging):
                    _write_version(staging, plan, cache)
                publish.publish_dir(model, staged, model, str(options.version))
            except BaseException:
                publish.remove_tree(model, staged)
                raise
            publish.replace_file(model, CONFIG_FILE, config_text)


def _write_version(folder: int, plan: bytes, cache: bytes | None) -> None:
    publish.write_file(folder, PLAN_FILE, plan)
    if cache is not None:
        publish.write_file(folder, CALIBRATION_CACHE, cache)
    publish.fsync_dir(folder)


def sample_inputs(options: ConvertOptions, sig: Signature, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs at the profile's opt shape: calibration samples when given, else random."""
    from ..vocabulary import datatypes

    shapes = profile_shapes(options, sig)
    rng = np.random.default_rng(seed)
    calibration = load_calibration(options.calibration_data, sig) if options.calibration_data else {}
    inputs = {}
    for name, dtype, _ in sig.inputs:
        shape = shapes[name][1]
        if name in calibration and len(calibration[name]) >= shape[0] and sig.batching:
            inputs[name] = np.ascontiguousarray(calibration[name][: shape[0]])
            continue
        numpy_type = datatypes.from_config(dtype).numpy
        if np.issubdtype(numpy_type, np.floating):
            inputs[name] = rng.standard_normal(shape).astype(numpy_type)
        elif numpy_type == np.bool_:
            inputs[name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            inputs[name] = rng.integers(0, 10, shape).astype(numpy_type)
    return inputs


def _median_ms(fn: Any, runs: int) -> float:
    fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def compare(options: ConvertOptions, sig: Signature, plan: bytes) -> dict[str, Any]:
    """Run onnxruntime and the engine on the same inputs: errors per output and the speed-up."""
    import onnxruntime as ort

    from ..backends.tensorrt import EngineRunner, require_tensorrt

    trt = require_tensorrt()
    from ..backends.tensorrt import _logger

    engine = trt.Runtime(_logger()).deserialize_cuda_engine(plan)
    runner = EngineRunner(engine, options.gpus[0])
    inputs = sample_inputs(options, sig)
    available = ort.get_available_providers()
    provider = "CUDAExecutionProvider" if "CUDAExecutionProvider" in available else "CPUExecutionProvider"
    session = ort.InferenceSession(str(options.onnx), providers=[provider])
    names = [n for n, _, _ in sig.outputs]
    try:
        reference = dict(zip(names, session.run(names, inputs), strict=True))
        got = runner.run(inputs, names)
        errors = error_stats(reference, got)
        ort_ms = _median_ms(lambda: session.run(names, inputs), options.compare_runs)
        trt_ms = _median_ms(lambda: runner.run(inputs, names), options.compare_runs)
    finally:
        runner.close()
    return {
        "errors": errors,
        "onnxruntime_provider": provider,
        "onnxruntime_ms": ort_ms,
        "tensorrt_ms": trt_ms,
        "speedup": ort_ms / trt_ms if trt_ms > 0 else float("inf"),
        "batch": next(iter(inputs.values())).shape[0] if sig.batching else 1,
    }


def run(options: ConvertOptions) -> int:
    check_options(options)
    sig = read_signature(options.onnx)
    config = render_config(options, sig)  # before the slow build: bad dims fail now
    layout = plan_layout(options)
    plan, cache = build_engine(options, sig, layout)
    write_model(options, layout, plan, cache, config_to_text(config))
    print(f"wrote {layout.plan} ({len(plan) / 1e6:.1f} MB)")
    if cache is not None:
        print(f"wrote {layout.calibration_cache}")
    print(f"wrote {layout.config}")
    if options.compare:
        _say("comparing the engine with onnxruntime on the same inputs")
        report = compare(options, sig, plan)
        for name, (max_abs, max_rel) in report["errors"].items():
            print(f"output '{name}': max abs error {max_abs:.3g}, max rel error {max_rel:.3g}")
        print(
            f"batch {report['batch']}: onnxruntime ({report['onnxruntime_provider']}) "
            f"{report['onnxruntime_ms']:.3f} ms, TensorRT {report['tensorrt_ms']:.3f} ms, "
            f"speed-up {report['speedup']:.2f}x"
        )
    return 0
