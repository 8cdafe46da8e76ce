"""Triton's response cache (the ``local`` implementation; ``redis`` in redis_cache.py): identical requests
answered without executing.

Semantics from docs/user_guide/response_cache.md: a request is keyed by model name, version and its
inputs (name, datatype, shape, data); one cache of ``--cache-config local,size=N`` bytes is shared by all
models; a model uses it only with ``response_cache { enable: true }``; only successful responses are
stored; sequence-batched models, decoupled models and ensembles (at the top level) are not cached.

Two choices where Triton is silent or weaker: the key is a 128-bit BLAKE2b digest (Triton uses a 64-bit
hash and warns that collisions return a wrong result) and includes the requested output names, so a
request for a subset of the outputs never receives another request's subset. Eviction is least recently
used; an entry larger than the whole cache is not stored.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..vocabulary import tensors
from ..vocabulary.types import InferenceRequest

if TYPE_CHECKING:
    from .redis_cache import RedisConfig


def request_key(request: InferenceRequest, version: str) -> bytes:
    """The cache key of ``request`` on ``version`` of its model."""
    h = hashlib.blake2b(digest_size=16)
    for part in (request.model_name, version):
        h.update(part.encode())
        h.update(b"\0")
    for name in sorted(request.inputs):
        array = request.inputs[name]
        h.update(name.encode())
        h.update(b"\0")
        h.update(tensors.v2_datatype(array).encode())
        h.update(np.asarray(array.shape, dtype=np.int64).tobytes())
        h.update(tensors.to_raw(array))
    outputs = request.requested_outputs
    h.update(b"*" if outputs is None else "\0".join(sorted(outputs)).encode())
    return h.digest()


@dataclass(slots=True)
class _Entry:
    outputs: dict[str, np.ndarray]
    nbytes: int


#: per entry, what ``footprint`` cannot see with ``sys.getsizeof``: the OrderedDict's slot and link node (with
#: the table's slack after evictions), the ``_Entry`` object, allocator headers, an array's shape and strides
#: (tests/unit/test_response_cache_footprint.py measures real entries with tracemalloc against it)
ENTRY_OVERHEAD = 256
#: per output array: its dims/strides allocation and the data buffer's allocator header
ARRAY_OVERHEAD = 48


def footprint(key: bytes, outputs: dict[str, np.ndarray]) -> int:
    """The bytes one cache entry holds in this process: key, outputs dict, names, array objects, their data
    (a BYTES array's element objects too) and the per-entry structure around them."""
    size = ENTRY_OVERHEAD + sys.getsizeof(key) + sys.getsizeof(outputs)
    for name, array in outputs.items():
        size += sys.getsizeof(name) + sys.getsizeof(array) + ARRAY_OVERHEAD + 16 * array.ndim
        if array.dtype == np.object_:
            size += sum(sys.getsizeof(v) for v in array.reshape(-1))
    return size


class ResponseCache:
    """A byte-bounded LRU of response outputs, shared by every model of the server."""

    #: lookup/insert do network I/O (server/runtime/redis_cache.py): run them off the event loop
    remote = False

    def __init__(self, byte_size: int) -> None:
        self.byte_size = byte_size
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self.lookups = self.hits = self.misses = self.evictions = self.inserts = 0
        self.lookup_ns = self.insertion_ns = 0

    @property
    def enabled(self) -> bool:
        return self.byte_size > 0

    def lookup(self, key: bytes) -> dict[str, np.ndarray] | None:
        start = time.perf_counter_ns()
        with self._lock:
            self.lookups += 1
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self._entries.move_to_end(key)
            self.lookup_ns += time.perf_counter_ns() - start
        return dict(entry.outputs) if entry is not None else None

    def insert(self, key: bytes, outputs: dict[str, np.ndarray]) -> bool:
        """Store a copy of ``outputs`` (results may be views into a batch); False when it does not fit."""
        start = time.perf_counter_ns()
        copies = {n: np.array(a, copy=True) for n, a in outputs.items()}
        for array in copies.values():
            array.setflags(write=False)  # shared by every later hit
        nbytes = footprint(key, copies)  # what the entry really holds, not just its tensor bytes
        with self._lock:
            if nbytes > self.byte_size:
                self.insertion_ns += time.perf_counter_ns() - start
                return False
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= old.nbytes
            while self._used + nbytes > self.byte_size and self._entries:
                _, evicted = self._entries.popitem(last=False)
                self._used -= evicted.nbytes
                self.evictions += 1
            self._entries[key] = _Entry(copies, nbytes)
            self._used += nbytes
            self.inserts += 1
            self.insertion_ns += time.perf_counter_ns() - start
        return True

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def utilization(self) -> float:
        return self._used / self.byte_size if self.byte_size else 0.0


def parse_cache_settings(items: list[str]) -> int | RedisConfig:
    """Every ``--cache-config CACHE,KEY=VALUE`` → the local cache's byte size (0: no cache) or the redis cache's
    config (``redis,KEY=VALUE`` repeated, one key each, as Triton takes them). Triton runs one cache: local and
    redis together are refused (qa/L0_response_cache greps "multiple cache configurations")."""
    from .redis_cache import redis_config

    size: int | None = None
    redis: dict[str, str] = {}
    for item in items:
        cache, _, setting = item.partition(",")
        if cache == "local":
            size = _local_size(item, setting)
        elif cache == "redis":
            key, sep, value = setting.partition("=")
            if not key or not sep:
                raise ValueError(f"--cache-config '{item}': the redis cache takes redis,<key>=<value>")
            redis[key] = value
        else:
            raise ValueError(f"--cache-config '{item}': unknown cache '{cache}' (the caches are local and redis)")
    if size is not None and redis:
        raise ValueError(
            "--cache-config: multiple cache configurations were given (local and redis); only one cache may be used"
        )
    return redis_config(redis) if redis else size or 0


def _local_size(item: str, setting: str) -> int:
    key, sep, value = setting.partition("=")
    if key != "size" or not sep:
        raise ValueError(f"--cache-config '{item}': the local cache takes size=<bytes>")
    try:
        size = int(value)
    except ValueError:
        raise ValueError(f"--cache-config '{item}': size must be an integer number of bytes") from None
    if size < 0:
        raise ValueError(f"--cache-config '{item}': size must not be negative")
    return size


def parse_cache_config(items: list[str]) -> int:
    """``--cache-config local,size=N`` (repeatable) → the local cache's byte size; a redis cache has no size:
    parse_cache_settings reads both."""
    for item in items:
        if not item.startswith("local,"):
            raise ValueError(
                f"--cache-config '{item}': only the 'local' cache is implemented by parse_cache_config "
                "(parse_cache_settings reads the redis cache)"
            )
    size = parse_cache_settings(items)
    assert isinstance(size, int)
    return size
