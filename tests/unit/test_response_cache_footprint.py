"""Issue 23: the response cache counts what its entries really hold, measured with tracemalloc.

The cache used to count only tensor bytes and the key (20 bytes for a one-float response), while each entry
held ~500 bytes of Python objects: a cache of 1 MB held ~25 MB. Every entry now counts its footprint, so a
cache full of tiny entries stays within its configured size.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from kubeinfer.server.runtime.cache import ResponseCache, footprint

SIZE = 200_000
SHAPES: dict[str, Callable[[int], dict[str, np.ndarray]]] = {
    "one float": lambda i: {"OUT": np.array([float(i)], np.float32)},
    "a scalar": lambda i: {"O": np.float32(i).reshape(())},
    "two rows of four": lambda i: {"OUT0": np.full((1, 4), i, np.float32), "OUT1": np.zeros((1, 4), np.float32)},
    "five small outputs": lambda i: {f"OUTPUT_{j}": np.full((1, 2, 2), i, np.int64) for j in range(5)},
    "one string": lambda i: {"OUT": np.array([b"abc%d" % i], dtype=object)},
    "eight strings": lambda i: {"OUT": np.array([b"value %d" % i] * 8, dtype=object)},
    "1 KiB": lambda i: {"OUT": np.full(256, i, np.float32)},
}


@pytest.mark.parametrize("outputs", SHAPES.values(), ids=SHAPES.keys())
def test_a_cache_of_tiny_entries_stays_within_its_size(outputs: Callable[[int], dict[str, np.ndarray]]) -> None:
    cache = ResponseCache(SIZE)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5000):  # far more than fit: the cache evicts
            cache.insert(i.to_bytes(16, "little"), outputs(i))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.evictions > 0 and cache.entries > 10
    assert held <= SIZE, f"{cache.entries} entries hold {held} bytes, more than the cache's {SIZE}"
    assert held <= cache.utilization * SIZE, "each entry counts at least what it holds"


def test_the_footprint_counts_the_objects_not_only_the_tensor_bytes() -> None:
    outputs = {"OUT": np.array([1.0], np.float32)}
    assert footprint(bytes(16), outputs) > 20 * (4 + 16)  # the old count was 4 tensor bytes + 16 key bytes
    strings = {"OUT": np.array([b"x" * 1000], dtype=object)}
    assert footprint(bytes(16), strings) > 1000 + footprint(bytes(16), {"OUT": np.array([b""], dtype=object)}) - 1
