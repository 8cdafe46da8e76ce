"""What the ``pb_utils`` API needs from the server, and which model instance is running on this thread.

Triton runs every instance in its own stub process, so module-level calls such as ``pb_utils.MetricFamily``
or ``pb_utils.get_model_dir()`` know their model without being told. Here instances share the process,
so the backend marks the instance whose code a thread is running (``running(instance)``) and the API
reads it back (``current()``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...vocabulary.custom_metrics import CustomMetrics
from ...vocabulary.registry_view import RegistryView


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


class _Binding:
    """The server the backend was loaded into (one per process)."""

    registry: RegistryView | None = None
    loop: asyncio.AbstractEventLoop | None = None
    custom_metrics: CustomMetrics = CustomMetrics()


server = _Binding()
_local = threading.local()


def bind(registry: RegistryView) -> None:
    server.registry = registry
    server.loop = registry.loop
    server.custom_metrics = registry.custom_metrics


def current() -> InstanceInfo | None:
    return getattr(_local, "instance", None)


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
