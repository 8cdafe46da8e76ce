"""Triton's classification extension: top-k of an output as "score:index[:label]" strings."""

from __future__ import annotations

import numpy as np

from ..config import ConfigError
from .errors import InvalidArgument


def parse_labels(data: bytes, name: str) -> list[str]:
    """One label per line, as Triton reads ``label_filename`` (``name``, for the message)."""
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read label file {name}: {exc}") from None


def classify(array: np.ndarray, k: int, labels: list[str] | None = None, batched: bool = True) -> np.ndarray:
    """Per batch row, the ``k`` highest scores as BYTES ``b"<score>:<index>[:<label>]"``, best first."""
    if array.dtype == np.object_:
        raise InvalidArgument("classification needs a numeric output")
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim > 1 else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    out = np.empty((rows.shape[0], k), dtype=object)
    for r in range(rows.shape[0]):
        for j, idx in enumerate(order[r]):
            text = f"{float(rows[r, idx]):f}:{int(idx)}"
            if labels is not None and idx < len(labels):
                text += f":{labels[idx]}"
            out[r, j] = text.encode()
    return out if batched and array.ndim > 1 else out.reshape(k)
