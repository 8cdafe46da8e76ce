"""Which accelerators this process can use (imports nothing GPU-specific until asked)."""

from __future__ import annotations

import os
from functools import lru_cache

from ..observability import nvml


@lru_cache(maxsize=1)
def gpu_count() -> int:
    """Visible NVIDIA GPUs: ``CUDA_VISIBLE_DEVICES`` when set (as CUDA reads it), else NVML's device count (the one
    NVML helper the GPU metrics use); 0 when there is no NVML (no driver, no GPU: every CPU machine)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return len(ids)
    library = nvml.library()
    if library is None:
        return 0
    count = nvml.optional(library.nvmlDeviceGetCount)
    return int(count) if count is not None else 0
