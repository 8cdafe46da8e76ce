"""The TensorRT build: parse the ONNX model, one optimization profile, FP16/INT8 flags, the serialized plan."""

from __future__ import annotations

import time
from typing import Any

from .calibrate import calibrator, load_calibration
from .layout import Layout
from .messages import ConvertError, say
from .options import ConvertOptions, batch_range
from .shapes import Signature, profile_shapes


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
                say(f"  {'  ' * self.depth[phase_name]}{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            return True

        def phase_finish(self, phase_name: str) -> None:
            self.depth.pop(phase_name, None)

    return Monitor()


def build_engine(options: ConvertOptions, sig: Signature, layout: Layout) -> tuple[bytes, bytes | None]:
    """Build the serialized engine; returns (plan, calibration cache or None)."""
    from ...backends.tensorrt import _logger, require_tensorrt
    from ...vocabulary.errors import Unavailable

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
    say(f"parsing {options.onnx}")
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
    fed = None
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
        fed = calibrator(trt, samples, batch, sig.batching, layout.calibration_cache, options.gpus[0])
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = fed
        config.set_calibration_profile(profile)
    precision = "+".join(p for p, on in (("FP16", options.fp16), ("INT8", options.int8)) if on) or "FP32"
    say(f"building {precision} engine (batch {'..'.join(map(str, batch_range(options)[::2]))}); this can take minutes")
    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ConvertError("TensorRT failed to build the engine (see the messages above)")
    say(f"built in {time.monotonic() - started:.1f}s")
    cache = fed.written if fed is not None else None
    if cache is None and options.int8 and layout.calibration_cache.is_file():
        cache = layout.calibration_cache.read_bytes()
    return bytes(serialized), cache
