"""The built engine against onnxruntime on the same inputs: max abs/rel error per output and the speed-up."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from .calibrate import load_calibration
from .messages import ConvertError
from .options import ConvertOptions
from .shapes import Signature, profile_shapes


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


def sample_inputs(options: ConvertOptions, sig: Signature, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs at the profile's opt shape: calibration samples when given, else random."""
    from ...vocabulary import datatypes

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


def median_ms(fn: Any, runs: int) -> float:
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

    from ...backends.tensorrt import EngineRunner, _logger, require_tensorrt

    trt = require_tensorrt()

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
        ort_ms = median_ms(lambda: session.run(names, inputs), options.compare_runs)
        trt_ms = median_ms(lambda: runner.run(inputs, names), options.compare_runs)
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
