"""What schedulers (ensembles) and backends (BLS) may ask of the model registry, as a ``typing.Protocol``.

They run below the runtime, so they cannot import the registry class; the runtime's ``ModelRegistry``
satisfies this interface structurally and is handed down when a model version is built.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from .types import InferenceRequest, InferenceResponse


class RegistryView(Protocol):
    #: the event loop requests run on; instance threads (Python models' BLS) submit back to it
    loop: asyncio.AbstractEventLoop | None

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Route ``request`` to its model version's scheduler, as a front end's request would be."""
        ...

    def resolve(self, name: str, version: str = "") -> object:
        """The ready model version ``name``/``version`` ("" = latest); raises ServerError when there is none."""
        ...
