"""Does a config's inputs/outputs agree with the ONNX file? Checked before a version goes live.

The most common config.pbtxt mistake is the batch dimension (dims must exclude it when
maxBatchSize > 0); catching it here turns a load failure on every server replica into one clear
message on the InferenceModel. The file is read by ``onnx_signature`` (a streaming read bounded in
time and memory), never loaded whole into the operator.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import onnx
from kubeinfer.server.config import pb
from kubeinfer.server.vocabulary import datatypes
from onnx import helper

from .artifacts import ArtifactError
from .onnx_signature import DEFAULT_BUDGET, LimitExceeded, Malformed, read_signature

#: seconds one file's check may take (the operator's --onnx-check-timeout)
DEFAULT_CHECK_TIMEOUT = 60.0


def _onnx_tensors(values: Iterable[onnx.ValueInfoProto], skip: set[str]) -> dict[str, tuple[str | None, list[int]]]:
    out = {}
    for vi in values:
        if vi.name in skip:
            continue
        ttype = vi.type.tensor_type
        try:
            dtype = datatypes.from_numpy(helper.tensor_dtype_to_np_dtype(ttype.elem_type)).v2
        except Exception:
            dtype = None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
        out[vi.name] = (dtype, dims)
    return out


def _open_regular(path: Path) -> int:
    """``path`` opened for reading if it is a regular file (not through a symlink); opening a FIFO planted there
    must not block the check (``O_NONBLOCK``), and a device or FIFO is refused before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_onnx(
    source: Path | int,
    config: pb.ModelConfig,
    version: int,
    *,
    name: str | None = None,
    timeout: float = DEFAULT_CHECK_TIMEOUT,
    budget: int = DEFAULT_BUDGET,
) -> list[str]:
    """Mismatches between ``config`` and the ONNX model ``source`` (a path, or a descriptor the writer opened
    through its confined walk, read from its start; ``name`` names it in messages), empty if they agree.

    Raises ArtifactError('CheckLimitExceeded') when reading the graph takes longer than ``timeout``
    seconds or holds more than ``budget`` bytes.
    """
    shown = name or (source.name if isinstance(source, Path) else "the model file")
    try:
        if isinstance(source, int):
            opened = os.fdopen(os.dup(source), "rb")
            opened.seek(0)
        else:
            opened = os.fdopen(_open_regular(source), "rb")
        with opened as f:
            sig = read_signature(f, timeout=timeout, budget=budget)
    except LimitExceeded as exc:
        raise ArtifactError(
            "CheckLimitExceeded",
            f"version {version}: {shown} could not be checked: {exc} ({exc.limit} limit of the operator's "
            "ONNX check); the file is refused",
            version,
        ) from None
    except (Malformed, OSError) as exc:
        reason = str(exc) if isinstance(exc, Malformed) else exc.strerror or type(exc).__name__
        return [f"version {version}: {shown} is not a readable ONNX model ({reason})"]
    problems: list[str] = []
    batching = config.max_batch_size > 0
    for kind, declared, actual in (
        ("input", config.input, _onnx_tensors(sig.inputs, sig.initializers)),
        ("output", config.output, _onnx_tensors(sig.outputs, set())),
    ):
        for t in declared:
            where = f"version {version}: {kind} '{t.name}'"
            if t.name not in actual:
                problems.append(f"{where} is not in the ONNX model, whose {kind}s are {sorted(actual)}")
                continue
            dtype, dims = actual[t.name]
            want_type = datatypes.config_to_v2(pb.DataType.Name(t.data_type))
            if dtype and dtype != want_type:
                problems.append(f"{where} is {dtype} in the ONNX model, but dataType says {want_type}")
            shape = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            if batching:
                if not dims:
                    problems.append(f"{where}: the ONNX tensor has no batch dimension but maxBatchSize > 0")
                    continue
                dims = dims[1:]
            if len(dims) != len(shape) or any(a != b and -1 not in (a, b) for a, b in zip(dims, shape, strict=True)):
                hint = (
                    " (dims must not include the batch dimension when maxBatchSize > 0)"
                    if batching and len(shape) == len(dims) + 1
                    else " (with maxBatchSize 0, dims include the batch dimension)"
                    if not batching and len(shape) + 1 == len(dims)
                    else ""
                )
                problems.append(
                    f"{where} has dims {shape} but the ONNX model's shape is "
                    f"{dims if not batching else ['batch', *dims]}{hint}"
                )
    return problems
