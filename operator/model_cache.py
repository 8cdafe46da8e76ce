"""``InferenceServer.spec.modelCache``: the pool's servers load models on demand within a memory budget.

The fields become the server's flags (``--model-cache-memory-budget``, ``--model-idle-unload-seconds``,
``--model-load-timeout``; see the server's ``runtime/model_cache.py``). The budget is a Kubernetes
quantity, as the pod's memory request is, and the server reads it in the same notation. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Load models on their first request instead of at start, within a memory budget per "
    "replica: before a load that would pass it, the least recently used idle models are unloaded (never one "
    "with requests in flight or a live sequence). Models not loaded still count as Ready (they serve on "
    "their next request, which waits for the load).",
    "properties": {
        "memoryBudget": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$",
            "description": "Host memory the loaded models of one replica may take (e.g. 4Gi; 0 or unset: "
            "no budget, models still load on demand). Keep it below the pod's memory limit minus the "
            "server's own (~150Mi plus the runtimes' start-up).",
        },
        "idleUnloadSeconds": {
            "type": "integer",
            "format": "int32",
            "minimum": 0,
            "description": "Unload a model no request used for this long (0 or unset: never).",
        },
        "loadTimeoutSeconds": {
            "type": "integer",
            "format": "int32",
            "minimum": 1,
            "description": "Longest a request waits for its model's load (and for room to load it), then "
            "503 / UNAVAILABLE (default 60).",
        },
    },
}

#: the server flags this field sets (refused in spec.server.extraArgs while modelCache is set)
FLAGS = (
    "--model-load-on-demand",
    "--model-cache-memory-budget",
    "--model-idle-unload-seconds",
    "--model-load-timeout",
)


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
