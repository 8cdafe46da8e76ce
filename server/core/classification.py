"""Triton's classification extension: top-k of an output as "score:index" strings."""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgument


def classify(array: np.ndarray, k: int, batched: bool = True) -> np.ndarray:
    """Per batch row, the ``k`` highest scores as BYTES ``b"<score>:<index>"``, best first."""
    if array.dtype == np.object_:
        raise InvalidArgument("classification needs a numeric output")
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim > 1 else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    out = np.empty((rows.shape[0], k), dtype=object)
    for r in range(rows.shape[0]):
        for j, idx in enumerate(order[r]):
            out[r, j] = f"{float(rows[r, idx]):f}:{int(idx)}".encode()
    return out if batched and array.ndim > 1 else out.reshape(k)
