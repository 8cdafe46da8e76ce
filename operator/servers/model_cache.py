"""``InferenceServer.spec.modelCache``: the pool's servers load models on demand within a memory budget.

The fields become the server's flags (``--model-cache-memory-budget``, ``--model-idle-unload-seconds``,
``--model-load-timeout``; see the server's ``runtime/model_cache.py``). The budget is a Kubernetes
quantity, as the pod's memory request is, and the server reads it in the same notation. Pure functions.
"""

from __future__ import annotations

from ..api.server_types import InferenceServerSpec


def server_flags(spec: InferenceServerSpec) -> list[str]:
    """The server flags for ``spec.modelCache`` (none without it)."""
    cache = spec.model_cache
    if cache is None:
        return []
    flags = ["--model-load-on-demand=true"]
    if cache.memory_budget not in (None, 0, "0", ""):
        flags.append(f"--model-cache-memory-budget={cache.memory_budget}")
    if cache.idle_unload_seconds:
        flags.append(f"--model-idle-unload-seconds={int(cache.idle_unload_seconds)}")
    if cache.load_timeout_seconds:
        flags.append(f"--model-load-timeout={int(cache.load_timeout_seconds)}")
    return flags
