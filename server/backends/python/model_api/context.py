"""Which model instance is running, and the host its ``pb_utils`` calls go to.

``pb_utils`` calls such as ``MetricFamily(...)``, ``get_model_dir()``, BLS ``exec()`` or ``Logger`` need
the server. Where they go depends on where the model runs:

* in a stub process (the default, as Triton runs Python models): one instance per process, and the host
  sends each call over the stub's channel to the server (``stub.StubHost``);
* in the server's own process (``KUBEINFER_IN_PROCESS``): instances share the process, so the backend
  marks the instance whose code a thread is running (``running(instance)``) and the host calls the
  registry directly (``inprocess.InProcessHost``).

Stub-safe: this module, like every module a stub imports, needs only the standard library and numpy
(tests/unit/test_python_stub_imports.py), so a stub runs under a model's own interpreter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .pb_request import InferenceRequest
    from .pb_types import InferenceResponse


@dataclass(frozen=True)
class InstanceInfo:
    """The facts about one model instance the API hands out."""

    model_name: str
    model_version: int
    #: Triton's instance name (``add_sub_0``); error texts name it
    instance_name: str
    version_dir: Path
    #: whose custom metric families these are (removed when the version unloads)
    metrics_owner: str


class MetricRefused(Exception):
    """A refused custom-metric operation (Triton's text). ``core``: refused by Triton's server core, so
    the Python API names the model instance in front of it."""

    def __init__(self, message: str, core: bool = True) -> None:
        super().__init__(message)
        self.core = core


class ControlRefused(Exception):
    """``load_model`` / ``unload_model`` refused by the server (its message, as the repository API's)."""


class BlsCall(Protocol):
    """The responses of one BLS request, in order; None after the last."""

    def next(self) -> InferenceResponse | None: ...

    async def anext(self) -> InferenceResponse | None: ...


class Host(Protocol):
    """What ``pb_utils`` asks of the server."""

    def bls(self, request: InferenceRequest, decoupled: bool) -> BlsCall:
        """Start ``request``; a refusal before it is queued is the call's one (error) response."""
        ...

    def is_model_ready(self, name: str, version: str) -> bool: ...

    def model_control(self, action: str, name: str, parameters: dict[str, Any], unload_dependents: bool) -> None:
        """``action`` "load" (with a load request's ``parameters``) or "unload"; raises ControlRefused."""
        ...

    def metric_family(self, name: str, description: str, kind: int, owner: str) -> Any:
        """A handle on family ``name`` (one more holder); raises MetricRefused."""
        ...

    def release_family(self, family: Any, owner: str) -> None: ...

    def metric(self, family: Any, labels: Any, buckets: Any) -> Any: ...

    def release_metric(self, family: Any, metric: Any) -> None: ...

    def metric_op(self, op: str, family: Any, metric: Any, value: float | None) -> float | None:
        """``increment``/``set``/``observe`` (value) or ``value``; raises MetricRefused."""
        ...

    def log(self, level: int, message: str) -> None:
        """One ``pb_utils.Logger`` line (level: Triton's INFO 0, WARNING 1, ERROR 2, VERBOSE 3)."""
        ...


class _Binding:
    host: Host | None = None
    #: the instance of a stub process: every thread of the process runs its code
    process_instance: InstanceInfo | None = None


_binding = _Binding()
_local = threading.local()


def bind_host(host: Host) -> None:
    _binding.host = host


def host() -> Host | None:
    return _binding.host


def set_process_instance(instance: InstanceInfo) -> None:
    """A stub process runs one instance: threads the model starts see it too."""
    _binding.process_instance = instance


def current() -> InstanceInfo | None:
    return getattr(_local, "instance", None) or _binding.process_instance


@contextmanager
def running(instance: InstanceInfo) -> Iterator[None]:
    """Mark ``instance`` as the model code this thread runs (nests; restores the outer one)."""
    outer = getattr(_local, "instance", None)
    _local.instance = instance
    try:
        yield
    finally:
        _local.instance = outer


def enter(instance: InstanceInfo) -> None:
    """Mark ``instance`` for the rest of this thread's life (an instance's own event-loop thread)."""
    _local.instance = instance
