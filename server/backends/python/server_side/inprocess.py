"""Python models in the server's own process: the opt-in (``parameters { key: "KUBEINFER_IN_PROCESS" }``).

One thread and one ``TritonPythonModel`` object per instance; tensors are handed over by reference and
BLS is a direct call into the registry on the server loop. What it costs is isolation: the model shares
the server's interpreter, GIL and crash fate (docs/backends/python.md). Each instance imports
``model.py`` and its sibling modules privately (``loader``), so module-level state is per instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from concurrent.futures import Future
from typing import Any

from ....config import ConfigError
from ....vocabulary import custom_metrics as store
from ....vocabulary.errors import BackendError, ServerError
from ....vocabulary.registry_view import EndSpan, RegistryView
from ....vocabulary.streaming import ResponseStream
from ....vocabulary.types import InferenceRequest as CoreRequest
from ...base import BackendInstance, Batch, InstanceSpec, RequestResult, Rescheduled
from ..model_api import context
from ..model_api.pb_request import RESCHEDULED, InferenceRequest, SenderState
from ..model_api.pb_types import InferenceResponse, Tensor, TritonError, TritonModelException
from ..stub.loader import ModelLoadError
from ..stub.runner import InitializeError, ModelRunner
from . import bridge

log = logging.getLogger("kubeinfer.python_model")

_KINDS = {0: store.COUNTER, 1: store.GAUGE, 2: store.HISTOGRAM}
_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


class InProcessHost:
    """``pb_utils`` calls answered by the server's own objects (``context.Host``)."""

    def __init__(self, registry: RegistryView) -> None:
        self.registry = registry
        self.loop = registry.loop
        self.metrics = registry.custom_metrics

    # ---- BLS ---------------------------------------------------------------------------------
    def bls(self, request: InferenceRequest, decoupled: bool) -> _StreamCall:
        fields = request._bls_fields()
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}

        async def start() -> tuple[ResponseStream, EndSpan | None]:
            return bridge.start_bls(self.registry, fields, inputs, decoupled)

        return _StreamCall(self, self._on_loop(start()))

    def _on_loop(self, coro: Any) -> Future[Any]:
        """Schedule ``coro`` on the server loop from a model's thread."""
        loop = self.loop
        if loop is None:
            coro.close()
            raise TritonModelException("BLS is only available inside a model served by kubeinfer")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise TritonModelException("BLS exec() must not be called on the server's event loop")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def is_model_ready(self, name: str, version: str) -> bool:
        return bool(self.registry.is_model_ready(name, version))

    # ---- model control ----------------------------------------------------------------------------
    def model_control(self, action: str, name: str, parameters: dict[str, Any], unload_dependents: bool) -> None:
        control = self.registry.model_control
        if control is None:
            raise TritonModelException(f"{action}_model() is only available inside a model served by kubeinfer")

        async def run() -> None:
            assert control is not None
            if action == "load":
                await control.load_with_parameters(name, parameters)
            else:
                await control.unload_model(name, unload_dependents, wait=False)

        try:
            self._on_loop(run()).result()
        except ServerError as exc:
            raise context.ControlRefused(exc.message) from None

    # ---- custom metrics ---------------------------------------------------------------------------
    def metric_family(self, name: str, description: str, kind: int, owner: str) -> store.CustomFamily:
        try:
            return self.metrics.family(name, description, _KINDS[kind], owner)
        except store.MetricError as exc:
            raise context.MetricRefused(str(exc), exc.core) from None

    def release_family(self, family: store.CustomFamily, owner: str) -> None:
        self.metrics.release_family(family, owner)

    def metric(self, family: store.CustomFamily, labels: Any, buckets: Any) -> store.CustomMetric:
        try:
            return self.metrics.metric(family, labels, buckets)
        except store.MetricError as exc:
            raise context.MetricRefused(str(exc), exc.core) from None

    def release_metric(self, family: store.CustomFamily, metric: store.CustomMetric) -> None:
        self.metrics.release_metric(family, metric)

    def metric_op(
        self, op: str, family: store.CustomFamily, metric: store.CustomMetric, value: float | None
    ) -> float | None:
        try:
            if op == "value":
                return self.metrics.value(family, metric)
            getattr(self.metrics, op)(family, metric, value)
            return None
        except store.MetricError as exc:
            raise context.MetricRefused(str(exc), exc.core) from None

    def log(self, level: int, message: str) -> None:
        log.log(_LEVELS.get(level, logging.INFO), "%s", message)


class _CallState:
    """What a ``_StreamCall`` knows, apart from the call itself, so that its finalizer can finish an abandoned one."""

    def __init__(self, started: Future[tuple[ResponseStream, EndSpan | None]]) -> None:
        self.started = started
        self.stream: ResponseStream | None = None
        #: ends the request's span with its final response (None: not traced)
        self.end: EndSpan | None = None
        #: the final response was read (the span, if any, ended with it), or the call was refused
        self.finished = False

    def end_once(self, response: Any) -> None:
        """``bridge.item_parts`` calls this with the final response."""
        self.finished = True
        if self.end is not None:
            self.end(response)


class _StreamCall:
    """A BLS request's responses from its ``ResponseStream``, read from the model's thread or loop.

    A model may drop a decoupled call's iterator before its final response. The stub process's server side reads
    every BLS stream to its end whatever the stub does; here the call is read lazily, so a finalizer does the same
    for an abandoned call: the rest of its stream is read on the loop and dropped, and the request's span (when
    traced) ends with its final response as it would have, instead of staying open and never being exported.
    """

    def __init__(self, host: InProcessHost, started: Future[tuple[ResponseStream, EndSpan | None]]) -> None:
        self._host = host
        self._state = _CallState(started)
        self._done = False
        if host.loop is not None:
            weakref.finalize(self, _drain_abandoned, self._state, host.loop)

    def _stream_of(self, started: tuple[ResponseStream, EndSpan | None]) -> ResponseStream:
        state = self._state
        state.stream, state.end = started
        return state.stream

    def next(self) -> InferenceResponse | None:
        if self._done:
            return None
        state = self._state
        stream = state.stream
        if stream is None:
            try:
                stream = self._stream_of(state.started.result())
            except bridge.BlsRefused as exc:
                return self._refused(exc)
        try:
            item = self._host._on_loop(_next_item(stream)).result()
        except StopAsyncIteration:
            self._done = state.finished = True
            return None
        return _response_of(item, state.end_once)

    async def anext(self) -> InferenceResponse | None:
        if self._done:
            return None
        state = self._state
        stream = state.stream
        if stream is None:
            try:
                stream = self._stream_of(await asyncio.wrap_future(state.started))
            except bridge.BlsRefused as exc:
                return self._refused(exc)
        try:
            item = await asyncio.wrap_future(self._host._on_loop(_next_item(stream)))
        except StopAsyncIteration:
            self._done = state.finished = True
            return None
        return _response_of(item, state.end_once)

    def _refused(self, exc: bridge.BlsRefused) -> InferenceResponse:
        self._done = self._state.finished = True
        return InferenceResponse(error=TritonError(str(exc), TritonError.INTERNAL))


def _drain_abandoned(state: _CallState, loop: asyncio.AbstractEventLoop) -> None:
    """The finalizer of a ``_StreamCall`` dropped before its final response: read the rest on the loop."""
    if state.finished or loop.is_closed():
        return

    async def drain() -> None:
        stream = state.stream
        if stream is None:
            try:
                started = await asyncio.wrap_future(state.started)
            except bridge.BlsRefused:
                return
            stream, state.end = started
        async for item in stream:
            bridge.item_parts(item, state.end_once)
            if item.final:
                return

    def start() -> None:
        task = loop.create_task(drain())
        _DRAINING.add(task)
        task.add_done_callback(_DRAINING.discard)

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing is left to read
        loop.call_soon_threadsafe(start)


#: the drains of abandoned calls, held until they end (the loop keeps only weak references to tasks)
_DRAINING: set[asyncio.Task[None]] = set()


async def _next_item(stream: ResponseStream) -> Any:
    return await stream.__anext__()


def _response_of(item: Any, end: EndSpan | None) -> InferenceResponse:
    outputs, parameters, error = bridge.item_parts(item, end)
    if error is not None:
        return InferenceResponse(error=TritonError(error[1], getattr(TritonError, error[0])))
    return InferenceResponse([Tensor(n, a) for n, a in outputs.items()], parameters=parameters)


class CoreState(SenderState):
    """A request of this process's runtime: responses go to its stream or its ``done`` future.

    ``done`` resolves when the request is complete: with its outputs or error (non-decoupled), or with
    None once the final flag went to the stream (decoupled).
    """

    def __init__(self, core: CoreRequest, decoupled: bool, wanted: frozenset[str] | None) -> None:
        super().__init__(decoupled)
        self.core = core
        self.wanted = wanted
        self.done: Future[RequestResult] = Future()

    def is_cancelled(self) -> bool:
        return self.core.cancelled

    def _outputs(self, response: InferenceResponse) -> dict[str, Any] | ServerError:
        error = response.error()
        return bridge.outputs_or_error(
            ((t.name(), t.as_numpy()) for t in response.output_tensors()),
            (error.code().name, error.message()) if error is not None else None,
            self.wanted,
        )

    def _deliver(self, response: InferenceResponse | None, final: bool) -> None:
        stream = self.core.stream
        if stream is None:  # a sequence batcher's filler row: its responses go nowhere (Triton's null request)
            if final:
                self.done.set_result(None)
            return
        if response is None:
            stream.send(None, final=True)
        else:
            result = self._outputs(response)
            if isinstance(result, ServerError):
                stream.send(None, error=result, final=final)
            else:
                stream.send(result, final=final, parameters=response._parameters or None)
        if final:
            self.done.set_result(None)

    def _finish(self, response: InferenceResponse) -> None:
        self.done.set_result(self._outputs(response))

    def _answer(self, response: InferenceResponse) -> RequestResult:
        result = self._outputs(response)
        if self.sender_used:
            self.done.set_result(result)
            return self.done
        return result

    def _fail(self, message: str) -> None:
        error = BackendError(message)
        if self.decoupled:
            if self.core.stream is not None:  # None: a filler row
                self.core.stream.fail(error)
            self.done.set_result(None)
        else:
            self.done.set_result(error)

    def _pending(self) -> RequestResult:
        if self.done.done() and not self.sender_used:
            return self.done.result()
        return self.done


class PythonInstance(BackendInstance):
    """One in-process instance: a ``ModelRunner`` on the instance's thread."""

    def __init__(self, backend: Any, spec: InstanceSpec, info: context.InstanceInfo) -> None:
        config = backend.config
        self.backend = backend
        self.version = backend.version
        self.decoupled = config.model_transaction_policy.decoupled
        self.output_names = backend.output_names()
        #: what goes out when a request names no outputs: every output the config names (Triton's
        #: python backend drops the others)
        self.all_outputs = frozenset(self.output_names)
        try:
            self.runner = ModelRunner(
                info, backend.model_file(), f"model '{config.name}'", self.decoupled, backend.code
            )
        except ModelLoadError as exc:
            raise ConfigError(str(exc)) from None
        try:
            self.runner.initialize(backend.initialize_args(spec, info))
        except InitializeError as exc:
            raise ConfigError(f"model '{config.name}': initialize failed: {exc}") from None

    def execute(self, batch: Batch) -> list[RequestResult]:
        t0 = time.perf_counter_ns()
        states: list[CoreState] = []
        requests = []
        for core in batch.requests:
            wanted = frozenset(core.requested_outputs) if core.requested_outputs is not None else self.all_outputs
            state = CoreState(core, self.decoupled, wanted)
            states.append(state)
            fields = bridge.incoming_fields(core, self.output_names, self.version)
            inputs = [Tensor(n, a) for n, a in core.inputs.items()]
            requests.append(InferenceRequest._incoming(fields, inputs, state))
        t1 = time.perf_counter_ns()
        results = [
            Rescheduled(self.backend.config.name) if r == RESCHEDULED else r
            for r in self.runner.execute(requests, list(states))
        ]
        t2 = time.perf_counter_ns()
        batch.timings.compute_input_ns = t1 - t0
        batch.timings.compute_infer_ns = t2 - t1
        return results

    def close(self) -> None:
        try:
            self.runner.finalize()
        finally:
            self.backend.instance_closed()
