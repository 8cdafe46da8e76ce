"""Process-wide backend settings from ``--backend-config`` (Triton's ``[<backend>,]<setting>=<value>``).

Triton keeps these per server process too (``TRITONSERVER_ServerOptionsSetBackendConfig``); a setting
without a backend name is global (``default-max-batch-size``) and applies to every backend that reads it.
"""

from __future__ import annotations

# Triton's default, in the config layer, where the operator's copy of the ONNX auto-complete reads it too
from ..config.onnx_rules import DEFAULT_MAX_BATCH_SIZE

_CONFIG: dict[str, dict[str, str]] = {}

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "configure", "default_max_batch_size", "setting"]


def configure(config: dict[str, dict[str, str]]) -> None:
    """Replace the settings (called once at start, before any model loads)."""
    _CONFIG.clear()
    _CONFIG.update({backend: dict(values) for backend, values in config.items()})


def setting(backend: str, key: str) -> str | None:
    """The backend's own value for ``key``, else the global one, else None."""
    value = _CONFIG.get(backend, {}).get(key)
    return value if value is not None else _CONFIG.get("", {}).get(key)


def default_max_batch_size(backend: str) -> int:
    value = setting(backend, "default-max-batch-size")
    try:
        return int(value) if value is not None else DEFAULT_MAX_BATCH_SIZE
    except ValueError:
        return DEFAULT_MAX_BATCH_SIZE
