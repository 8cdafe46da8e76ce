"""What schedulers (ensembles) and backends (BLS) may ask of the model registry, as a ``typing.Protocol``.

They run below the runtime, so they cannot import the registry class; the runtime's ``ModelRegistry``
satisfies this interface structurally and is handed down when a model version is built.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from .custom_metrics import CustomMetrics
from .streaming import ResponseStream
from .types import InferenceRequest, InferenceResponse

#: a model request's route through the registry (to its version's scheduler)
Route = Callable[[InferenceRequest], Awaitable[InferenceResponse]]
#: how a streamed request starts (the registry's ``infer_stream``)
StartStream = Callable[[InferenceRequest], ResponseStream]
#: ends a traced request's span with its last response (None: it sent none); later calls do nothing
EndSpan = Callable[[InferenceResponse | None], None]


class AroundInfer(Protocol):
    """What runs around model requests (the OpenTelemetry tracer's model spans)."""

    def __call__(self, request: InferenceRequest, route: Route) -> Awaitable[InferenceResponse]:
        """Around every model request the registry routes, a front end's and an ensemble step's alike: it calls
        the route it is given."""
        ...

    def bls(self, parent: int, request: InferenceRequest, start: StartStream) -> tuple[ResponseStream, EndSpan | None]:
        """Start a Python model's BLS request with ``start`` as a child of the traced request whose Triton trace
        id is ``parent`` (``InferenceRequest.trace_id``): the stream, and what ends the child's span once its final
        response was read or the stream was cancelled (None: ``parent`` is no open span; nothing is traced)."""
        ...


class ModelControl(Protocol):
    """Explicit model control as the repository API offers it, for models that load and unload models
    (Python backend ``pb_utils.load_model``/``unload_model``). Raises ServerError as the API would."""

    async def load_with_parameters(self, name: str, parameters: Mapping[str, Any]) -> None:
        """Load or reload ``name`` with a load request's parameters (``config``: a JSON config override)."""
        ...

    async def unload_model(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        """Stop routing to ``name``; ``wait=False`` returns before its versions have drained."""
        ...


class RegistryView(Protocol):
    #: the event loop requests run on; instance threads (Python models' BLS) submit back to it
    loop: asyncio.AbstractEventLoop | None
    #: metric families models create (Python backend ``pb_utils.MetricFamily``)
    custom_metrics: CustomMetrics
    #: the server's model control (set by the service that owns the registry; None without one)
    model_control: ModelControl | None
    #: runs around each request ``infer`` routes and each traced BLS request (set once at start; None: nothing does)
    around_infer: AroundInfer | None

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Route ``request`` to its model version's scheduler, as a front end's request would be."""
        ...

    def infer_stream(self, request: InferenceRequest) -> ResponseStream:
        """Start ``request`` and return the stream its responses arrive on (any model, decoupled or not).

        Errors found before the request is queued (unknown model, bad input) are raised here.
        """
        ...

    def resolve(self, name: str, version: str = "") -> object:
        """The ready model version ``name``/``version`` ("" = latest); raises ServerError when there is none."""
        ...

    def is_model_ready(self, name: str, version: str = "") -> bool: ...

    def loads_on_demand(self, name: str) -> bool:
        """Whether a request for ``name`` would load it now (the model cache), though it is not loaded."""
        ...

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model answers through a response stream; raises ServerError for an unknown model."""
        ...
