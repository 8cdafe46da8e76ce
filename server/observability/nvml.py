"""NVML (the ``nvidia-ml-py`` package's ``pynvml``), loaded and initialized once per process, for every reader.

Two readers use it: the GPU gauges of ``/metrics`` (``system.GpuReader``) and the GPU memory a model load
costs (``runtime.footprint``). Loading it here once keeps one answer to "is there NVML?" and one
``nvmlInit`` per process. Where NVML cannot be loaded (no package, no driver, no GPU: every CPU machine)
``library()`` is None for good and the readers report nothing, as Triton leaves out GPU metrics then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
#: [] until the first call, then [the initialized pynvml module] or [None]
_loaded: list[Any] = []


def library() -> Any | None:
    """The initialized ``pynvml`` module, or None where NVML is not there (the reason is logged once, at debug)."""
    with _lock:
        if not _loaded:
            try:
                import pynvml

                pynvml.nvmlInit()
                _loaded.append(pynvml)
            except Exception as exc:  # no package (ImportError), no driver or no GPU (pynvml.NVMLError)
                log.debug("NVML unavailable, no GPU readings: %s", exc)
                _loaded.append(None)
        return _loaded[0]


def optional(read: Callable[..., Any]) -> Any:
    """``read()``, or None when the device does not support that field (power on some boards)."""
    try:
        return read()
    except Exception:  # pynvml.NVMLError_NotSupported and kin
        return None
