"""Does a config's inputs/outputs agree with the ONNX file? Checked before a version goes live.

The most common config.pbtxt mistake is the batch dimension (dims must exclude it when
maxBatchSize > 0); catching it here turns a load failure on every server replica into one clear
message on the InferenceModel. The rules and their words are the server's own
(``kubeinfer.server.config.onnx_rules``: the auto-complete the server runs, then its load check), so
what the operator refuses is what the server would fail to load. The file is read by
``kubeinfer.server.config.onnx_signature`` (a streaming read bounded in time and memory), never
loaded whole into the operator.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kubeinfer.server.config import onnx_rules, pb
from kubeinfer.server.config.onnx_signature import (
    DEFAULT_BUDGET,
    LimitExceeded,
    Malformed,
    graph_tensors,
    read_signature,
)

from .artifacts import ArtifactError

#: seconds one file's check may take (the operator's --onnx-check-timeout)
DEFAULT_CHECK_TIMEOUT = 60.0


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
        return [f"version {version}: cannot read ONNX model {shown}: {reason}"]
    inputs, outputs = graph_tensors(sig)
    # the server auto-completes before it checks (the operator's servers run with auto-complete on, and with
    # Triton's default-max-batch-size: the operator passes no --backend-config)
    completed = pb.ModelConfig()
    completed.CopyFrom(config)
    onnx_rules.complete(completed, inputs, outputs, onnx_rules.DEFAULT_MAX_BATCH_SIZE)
    return [f"version {version}: {problem}" for problem in onnx_rules.mismatches(completed, inputs, outputs)]
