"""What the load is made of: the model's inputs (from the server's metadata and config APIs) and their data.

Input data follow perf_analyzer's ``--input-data``: ``random`` (the default; generated once), ``zero``, a
JSON file in perf_analyzer's format (``{"data": [{"INPUT0": [..] | {"content": [..], "shape": [..]}}, ..]}``,
one entry per step; requests cycle through the entries) or a folder of ``<input name>.npy`` files (one
step). Shapes: the server's dims, with ``--shape NAME:d1,d2`` filling in variable (-1) dimensions; the
batch dimension (``-b``) is added for models with ``max_batch_size > 0``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...vocabulary import datatypes


class PerfError(Exception):
    """A problem with the command line, the model or the server that stops the measurement."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str
    #: dims without the batch dimension; -1 = variable (needs --shape)
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    #: 0: the model has no batch dimension (requests carry the dims as they are)
    max_batch_size: int


def model_info(metadata: dict[str, Any], config: dict[str, Any] | None, name: str, version: str) -> ModelInfo:
    """From the v2 metadata (and, where the server has one, the config API's ``max_batch_size``).

    Without a config API (MLServer; its gRPC ModelConfig answers an empty config) a leading -1 in every
    input's shape is taken as the batch dimension.
    """
    raw_inputs = metadata.get("inputs") or []
    if not raw_inputs:
        raise PerfError(f"model '{name}' declares no inputs in its metadata: cannot build requests")
    if config is not None and config.get("name"):
        max_batch = int(config.get("max_batch_size", 0) or 0)
    else:
        # int(): gRPC metadata carries int64 dims as strings once turned into a dict
        leading = [[int(d) for d in i.get("shape") or []][:1] for i in raw_inputs]
        max_batch = 2**31 - 1 if all(lead == [-1] for lead in leading) else 0
    strip = 1 if max_batch > 0 else 0
    inputs = []
    for item in raw_inputs:
        shape = [int(d) for d in item.get("shape") or []]
        inputs.append(InputSpec(item["name"], item["datatype"], tuple(shape[strip:])))
    outputs = tuple(o["name"] for o in metadata.get("outputs") or [])
    return ModelInfo(name, version, tuple(inputs), outputs, max_batch)


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """``--shape NAME:d1,d2`` (perf_analyzer's syntax; ``x`` separators accepted too)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise PerfError(f"--shape {spec!r}: expected NAME:d1,d2,... (e.g. INPUT0:1,16)")
        try:
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(",") if d != "")
        except ValueError:
            raise PerfError(f"--shape {spec!r}: dimensions must be integers") from None
        if any(d < 0 for d in shapes[name]):
            raise PerfError(f"--shape {spec!r}: dimensions must not be negative")
    return shapes


def resolve_shapes(info: ModelInfo, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each input's dims without the batch dimension, variable ones filled in from ``--shape``."""
    unknown = sorted(set(shapes) - {i.name for i in info.inputs})
    if unknown:
        raise PerfError(f"--shape names {', '.join(unknown)}, not an input of model '{info.name}'")
    out = {}
    for spec in info.inputs:
        dims = shapes.get(spec.name, spec.dims)
        if len(dims) != len(spec.dims) or any(want not in (-1, got) for want, got in zip(spec.dims, dims, strict=True)):
            raise PerfError(f"--shape {spec.name}:{','.join(map(str, dims))} does not fit the model's dims {spec.dims}")
        if any(d < 0 for d in dims):
            raise PerfError(
                f"input '{spec.name}' has variable dims {list(spec.dims)}: give them with --shape {spec.name}:d1,d2,..."
            )
        out[spec.name] = tuple(dims)
    return out


def _random(datatype: str, shape: tuple[int, ...], rng: np.random.Generator, string_length: int) -> np.ndarray:
    dt = datatypes.from_v2(datatype)
    if dt.v2 == "BYTES":
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
        count = int(np.prod(shape)) if shape else 1
        out = np.empty(count, dtype=object)
        for i in range(count):
            out[i] = rng.choice(letters, string_length).tobytes()
        return out.reshape(shape)
    assert dt.numpy is not None
    if dt.v2 == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dt.numpy.kind in "iu":
        info = np.iinfo(dt.numpy)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dt.numpy)
    return rng.standard_normal(shape).astype(dt.numpy)


def _zero(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dt = datatypes.from_v2(datatype)
    if dt.v2 == "BYTES":
        out = np.empty(shape, dtype=object)
        out.fill(b"")
        return out
    assert dt.numpy is not None
    return np.zeros(shape, dtype=dt.numpy)


def _from_json(value: Any, spec: InputSpec, dims: tuple[int, ...], where: str) -> np.ndarray:
    shape: tuple[int, ...] = dims
    if isinstance(value, dict):
        if "b64" in value:
            raise PerfError(f"{where}: base64 ('b64') input data is not supported; give 'content' as a list")
        shape = tuple(int(d) for d in value.get("shape", dims))
        value = value.get("content")
    dt = datatypes.from_v2(spec.datatype)
    if dt.v2 == "BYTES":
        flat = np.array([str(v).encode() for v in np.asarray(value, dtype=object).ravel()], dtype=object)
    else:
        assert dt.numpy is not None
        flat = np.asarray(value, dtype=dt.numpy).ravel()
    # a wrong element count is sent as it is: the server says what is wrong, and perf counts the errors
    return flat.reshape(shape) if int(np.prod(shape)) == flat.size else flat


def input_steps(
    info: ModelInfo,
    dims: dict[str, tuple[int, ...]],
    source: str,
    batch_size: int,
    string_length: int = 128,
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """The data of each step (requests cycle through them), batch dimension included where the model has one."""
    if batch_size < 1:
        raise PerfError(f"-b {batch_size}: the batch size must be at least 1")
    if info.max_batch_size == 0 and batch_size != 1:
        raise PerfError(f"model '{info.name}' does not support batching (max_batch_size 0): -b must be 1")
    if info.max_batch_size and batch_size > info.max_batch_size:
        raise PerfError(f"-b {batch_size} is larger than the model's max_batch_size {info.max_batch_size}")
    lead = (batch_size,) if info.max_batch_size > 0 else ()
    if source in ("random", "zero"):
        rng = np.random.default_rng(seed)
        step = {}
        for spec in info.inputs:
            shape = lead + dims[spec.name]
            step[spec.name] = (
                _random(spec.datatype, shape, rng, string_length) if source == "random" else _zero(spec.datatype, shape)
            )
        return [step]
    path = Path(source)
    if path.is_dir():
        step = {}
        for spec in info.inputs:
            file = path / f"{spec.name}.npy"
            if not file.is_file():
                raise PerfError(f"--input-data {path}: no {file.name} for input '{spec.name}'")
            step[spec.name] = np.load(file, allow_pickle=spec.datatype == "BYTES")
        return [step]
    if not path.is_file():
        raise PerfError(f"--input-data {source!r}: expected random, zero, a JSON file or a folder of .npy files")
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PerfError(f"--input-data {path}: {exc}") from None
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f'--input-data {path}: expected {{"data": [{{"<input>": [...]}}, ...]}}')
    steps = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PerfError(f"--input-data {path}: data[{n}] must be an object of input name → values")
        step = {}
        for spec in info.inputs:
            if spec.name not in entry:
                raise PerfError(f"--input-data {path}: data[{n}] has no values for input '{spec.name}'")
            where = f"--input-data {path}: data[{n}].{spec.name}"
            array = _from_json(entry[spec.name], spec, dims[spec.name], where)
            # perf_analyzer's files hold one sample without the batch dimension: repeat it for -b
            step[spec.name] = np.stack([array] * batch_size) if lead and array.ndim == len(dims[spec.name]) else array
        steps.append(step)
    return steps
