"""``InferenceServer.spec.modelCache``: the pool's servers load models on demand within a memory budget.

The fields become the server's flags (``--model-cache-memory-budget``, ``--model-idle-unload-seconds``,
``--model-load-timeout``; see the server's ``runtime/model_cache.py``). The budget is a Kubernetes
quantity, as the pod's memory request is, and the server reads it in the same notation. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def server_flags(spec: Mapping[str, Any]) -> list[str]:
    """The server flags for ``spec.modelCache`` (none without it)."""
    cache = spec.get("modelCache")
    if cache is None:
        return []
    flags = ["--model-load-on-demand=true"]
    budget = cache.get("memoryBudget")
    if budget not in (None, 0, "0", ""):
        flags.append(f"--model-cache-memory-budget={budget}")
    if cache.get("idleUnloadSeconds"):
        flags.append(f"--model-idle-unload-seconds={int(cache['idleUnloadSeconds'])}")
    if cache.get("loadTimeoutSeconds"):
        flags.append(f"--model-load-timeout={int(cache['loadTimeoutSeconds'])}")
    return flags
