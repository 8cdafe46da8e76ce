"""INT8 calibration: the samples from ``--calibration-data`` and TensorRT's entropy calibrator that feeds
them to the GPU batch by batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .messages import ConvertError, say
from .shapes import Signature


def load_calibration(path: Path, sig: Signature) -> dict[str, np.ndarray]:
    """Calibration samples per input, each [N, ...] (batching models) in the model's dtype."""
    from ...vocabulary import datatypes

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


def calibrator(
    trt: Any, samples: dict[str, np.ndarray], batch: int, batching: bool, cache: Path, device_id: int
) -> Any:
    from ...backends.cuda_runtime import DeviceBuffer, Stream

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
            say(f"  calibration batch {self.index // batch}/{self.total // batch}")
            return pointers

        def read_calibration_cache(self) -> bytes | None:
            if cache.is_file():
                say(f"  reusing calibration cache {cache}")
                return cache.read_bytes()
            return None

        def write_calibration_cache(self, data: Any) -> None:
            self.written = bytes(data)

    return EntropyCalibrator()
