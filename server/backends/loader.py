"""Finds backend classes: built-ins plus the ``kubeinfer.backends`` entry-point group."""

from __future__ import annotations

import logging
from functools import lru_cache
from importlib.metadata import entry_points

from ..config import pb
from ..config.platforms import backend_for
from ..vocabulary.errors import InvalidArgument
from .base import Backend

log = logging.getLogger(__name__)

#: built-ins by backend name, imported lazily so GPU-only code never loads on CPU machines
_BUILTIN = {
    "onnxruntime": "kubeinfer.server.backends.onnxruntime:OnnxRuntimeBackend",
    "python": "kubeinfer.server.backends.python.server_side.backend:PythonBackend",
    "pytorch": "kubeinfer.server.backends.pytorch:PyTorchBackend",
    "tensorrt": "kubeinfer.server.backends.tensorrt:TensorRTBackend",
    "tensorflow": "kubeinfer.server.backends.tensorflow:TensorFlowBackend",
}


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group="kubeinfer.backends"):
        found[ep.name] = ep.value
    return found


#: --allowed-backends: the backends this process may load (None: all); set once at start by the CLI
_allowed: frozenset[str] | None = None


def allow_only(names: list[str] | None) -> None:
    """Refuse every backend not in ``names`` (a platform team keeps model code, e.g. ``python`` and
    ``pytorch``, off a shared pool); None allows all."""
    global _allowed
    _allowed = None if names is None else frozenset(names)


def available_backends() -> list[str]:
    return sorted(_entry_points())


def load_backend_class(config: pb.ModelConfig) -> type[Backend]:
    name = backend_for(config)
    if _allowed is not None and name not in _allowed:
        raise InvalidArgument(
            f"backend '{name}' is not allowed on this server (--allowed-backends="
            f"{','.join(sorted(_allowed)) or 'none'})"
        )
    target = _entry_points().get(name)
    if target is None:
        raise InvalidArgument(
            f"no backend for platform '{config.platform}' / backend '{config.backend}'; "
            f"available backends: {', '.join(available_backends())}"
        )
    module_name, _, attr = target.partition(":")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"backend '{name}' cannot be loaded on this machine: {exc}") from None
    cls: type[Backend] = getattr(module, attr)
    return cls
