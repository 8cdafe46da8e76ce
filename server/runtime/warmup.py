"""Model warm-up (``model_warmup`` in config.pbtxt), run on every instance before the version is READY.

Triton (docs/user_guide/model_configuration.md "Model Warmup", ``ModelWarmup`` in model_config.proto):
each sample is a request of ``batch_size`` rows whose inputs are zeros (``zero_data``), random values
(``random_data``) or the bytes of ``<model>/warmup/<input_data_file>`` (one batch element, row-major; BYTES
elements as 4-byte length + bytes; read through the model folder's descriptor, and refused when a symlink
leads out of the model's folder), run ``count`` times (0 = once) on each model instance. "A model
instance will be served only if it completes the requests successfully": a failed sample fails the load
with the sample's name and the model's error. A reload warms the new version up before the switch, so no
request ever reaches a cold version.

Warm-up executions go through the instance pool, so they show in the version's statistics
(``execution_count``, ``inference_count``, ``batch_stats``) from the moment it is READY, while its
request counters (``inference_stats.success``) stay at zero: nobody sent those requests.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..backends.base import Batch
from ..config import pb
from ..repository.model_files import ModelFolder
from ..scheduling.instance_pool import InstancePool
from ..vocabulary import datatypes, tensors
from ..vocabulary.errors import InvalidArgument, ServerError
from ..vocabulary.types import InferenceRequest
from .reshape import Reshaper

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


def _input(
    config: pb.ModelConfig,
    sample: pb.ModelWarmup,
    name: str,
    spec: pb.ModelWarmup.Input,
    model_dir: ModelFolder | None,
) -> np.ndarray:
    where = f"model_warmup '{sample.name}' input '{name}'"
    type_name = pb.DataType.Name(spec.data_type)
    try:
        dt = datatypes.from_config(type_name)
    except Exception:
        raise InvalidArgument(f"{where}: unknown data_type {type_name}") from None
    dims = [int(d) for d in spec.dims]
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"{where}: dims {dims} must be fixed sizes")
    rows = max(1, sample.batch_size) if config.max_batch_size > 0 else 0
    count = tensors.element_count(dims)
    kind = spec.WhichOneof("input_data_type")
    if kind == "input_data_file":
        if model_dir is None:
            raise InvalidArgument(f"{where}: input_data_file needs the model folder")
        relative = f"{WARMUP_FOLDER}/{spec.input_data_file}"
        try:
            raw = model_dir.read(relative, f"{where}: input_data_file")
        except OSError as exc:
            raise InvalidArgument(f"{where}: cannot read {relative}: {exc.strerror or exc}") from None
        if dt.numpy is None or dt.v2 == "BYTES":
            one = tensors.deserialize_bytes_tensor(raw, count, name)
        else:
            need = count * dt.itemsize
            if len(raw) < need:
                raise InvalidArgument(
                    f"{where}: {spec.input_data_file} holds {len(raw)} bytes, {dims} of {dt.v2} needs {need}"
                )
            one = np.frombuffer(raw[:need], dtype=dt.numpy.newbyteorder("<"))
        one = one.reshape(dims)
    elif kind == "random_data":
        rng = np.random.default_rng(0)
        if dt.numpy is None:
            one = np.array([rng.bytes(8) for _ in range(count)], dtype=object).reshape(dims)
        elif dt.numpy.kind == "b":
            one = rng.integers(0, 2, size=dims).astype(bool)
        elif dt.numpy.kind in "iu":
            one = rng.integers(0, 100, size=dims).astype(dt.numpy)
        else:
            one = rng.random(size=dims).astype(dt.numpy)
    else:  # zero_data (Triton's default when none is set)
        if dt.numpy is None:
            one = np.empty(dims, dtype=object)
            one.reshape(-1)[:] = b""
        else:
            one = np.zeros(dims, dtype=dt.numpy)
    if rows:
        return np.repeat(one[np.newaxis, ...], rows, axis=0)
    return one


def warmup_requests(config: pb.ModelConfig, model_dir: ModelFolder | None) -> list[tuple[str, int, InferenceRequest]]:
    """(sample name, times, request) for every warm-up sample; raises InvalidArgument on a bad sample."""
    declared = {t.name: t.data_type for t in config.input}
    #: samples are written in the inputs' dims, as requests are, and reach the model reshaped as they do
    reshaper = Reshaper(config)
    out = []
    for i, sample in enumerate(config.model_warmup):
        name = sample.name or f"sample {i}"
        if config.max_batch_size > 0 and sample.batch_size > config.max_batch_size:
            raise InvalidArgument(
                f"model_warmup '{name}': batch_size {sample.batch_size} exceeds max_batch_size {config.max_batch_size}"
            )
        inputs = {}
        for input_name, spec in sample.inputs.items():
            if input_name in declared and declared[input_name] != spec.data_type:
                raise InvalidArgument(
                    f"model_warmup '{name}' input '{input_name}' is {pb.DataType.Name(spec.data_type)} but the "
                    f"model input is {pb.DataType.Name(declared[input_name])}"
                )
            inputs[input_name] = _input(config, sample, input_name, spec, model_dir)
        try:
            inputs = reshaper.model_inputs(inputs)
        except InvalidArgument as exc:
            raise InvalidArgument(f"model_warmup '{name}': {exc.message}") from None
        request = InferenceRequest(config.name, inputs=inputs, id=f"warmup:{name}")
        out.append((name, max(1, sample.count), request))
    return out


async def warm_up(config: pb.ModelConfig, version: int, pool: InstancePool, model_dir: ModelFolder | None) -> None:
    """Run every sample on every instance; raises ServerError naming the sample that failed."""
    samples = warmup_requests(config, model_dir)
    if not samples:
        return
    started = time.monotonic()
    for slot in range(pool.size):
        for name, times, request in samples:
            for _ in range(times):
                (result,) = await pool.execute(slot, Batch([request], config.max_batch_size))
                if isinstance(result, Exception):
                    message = (
                        result.message if isinstance(result, ServerError) else f"{type(result).__name__}: {result}"
                    )
                    raise InvalidArgument(
                        f"model '{config.name}' version {version} failed warm-up sample '{name}' on instance "
                        f"{slot}: {message}"
                    )
    runs = sum(times for _, times, _ in samples) * pool.size
    log.info(
        "warmed up %s version %s: %d sample run(s) on %d instance(s) in %.2fs",
        config.name,
        version,
        runs,
        pool.size,
        time.monotonic() - started,
    )
