"""Runs Triton ``model.py`` files in-process: one ``TritonPythonModel`` object per instance thread.

Why in-process: tensors are handed over by reference (no copy through shared memory as with Triton's
stub processes; see benchmarks/python_backend_isolation.py), and BLS calls go straight to the registry
on the server loop. The trade-off is isolation: a model shares the server's interpreter, GIL and crash
fate. Each instance imports ``model.py`` and its sibling modules privately (``loader``), so module-level
state is per instance as with Triton's one-process-per-instance design.

``execute`` follows Triton's stub (python_backend src/pb_stub.cc ``ProcessRequests`` and
``ProcessRequestsDecoupled``, messages checked against Triton 2.51):

* non-decoupled: a list with one ``InferenceResponse`` per request, where ``None`` (or returning ``None``
  altogether) means the request answers through its response sender, possibly after ``execute`` returns;
  a coroutine ``execute`` runs to completion on the instance's own event loop;
* decoupled: ``execute`` returns ``None`` and every response goes through the senders, from ``execute``
  or from any thread later; an ``async def execute`` runs on the instance's background event loop, so
  the instance takes the next requests while earlier coroutines still answer;
* an exception (or a wrong return value) fails every request not yet complete with
  ``Failed to process the request(s) for model '<instance>', message: <Type>: <message>`` plus the
  traceback in pybind11's ``At:`` form, and the same text goes to the server log.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from ...config import ConfigError, config_from_dict, config_to_dict, config_to_triton_json, pb, sequence
from ...vocabulary.errors import BackendError
from ...vocabulary.registry_view import RegistryView
from ..base import Backend, BackendInstance, Batch, InstanceSpec, RequestResult
from . import context
from . import triton_python_backend_utils as pb_utils
from .loader import ModelModule, enter_module
from .pb_request import InferenceRequest, RequestState
from .pb_types import InferenceResponse, TritonModelException

log = logging.getLogger("kubeinfer.python_model")

# existing Triton models do `import triton_python_backend_utils as pb_utils`
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

_OWN_FILES = (str(Path(__file__).parent), str(Path(asyncio.__file__).parent))


class PythonBackend(Backend):
    name: ClassVar[str] = "python"

    def __init__(
        self, config: pb.ModelConfig, version_path: Path, version: int, context_view: RegistryView | None = None
    ) -> None:
        super().__init__(config, version_path, version, context_view)
        if context_view is not None:
            context.bind(context_view)
        #: custom metric families this load creates belong to it (gone when it unloads)
        self.metrics_owner = f"{config.name}/{version}/{id(self):x}"
        self._live = 0
        self._lock = threading.Lock()

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Let the model's optional ``auto_complete_config`` staticmethod fill inputs/outputs/batching."""
        module = ModelModule(cls.model_path(config, version_path), f"model '{config.name}'")
        try:
            hook = getattr(module.model_class, "auto_complete_config", None)
            if hook is None:
                return
            helper = pb_utils.ModelConfig(config_to_dict(config))
            with module.active():
                try:
                    returned = hook(helper)
                except Exception as exc:
                    raise ConfigError(
                        f"model '{config.name}': auto_complete_config failed: {type(exc).__name__}: {exc}"
                    ) from None
            if not isinstance(returned, pb_utils.ModelConfig):
                raise ConfigError(
                    f"auto_complete_config function in model '{config.name}' must return a valid pb.ModelConfig object."
                )
            config.CopyFrom(config_from_dict(returned.as_dict()))
        finally:
            module.unload()

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        instance = PythonInstance(self, spec)
        with self._lock:
            self._live += 1
        return instance

    def instance_closed(self) -> None:
        with self._lock:
            self._live -= 1
            last = self._live == 0
        if last:
            context.server.custom_metrics.remove_owner(self.metrics_owner)


class PythonInstance(BackendInstance):
    def __init__(self, backend: PythonBackend, spec: InstanceSpec) -> None:
        config = backend.config
        self.backend = backend
        self.model_name = config.name
        self.version = backend.version
        self.decoupled = config.model_transaction_policy.decoupled
        self.output_names = [t.name for t in config.output]
        # implicit state: the sequence batcher reads the state outputs of every step
        self.output_names += sorted(sequence.state_output_names(config) - set(self.output_names))
        self.info = context.InstanceInfo(
            model_name=config.name,
            model_version=backend.version,
            instance_name=spec.instance_name or f"{spec.name}_{spec.index}",
            version_dir=backend.version_path,
            metrics_owner=backend.metrics_owner,
        )
        self._loop: asyncio.AbstractEventLoop | None = None  # coroutine initialize/execute/finalize
        self._background: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None  # decoupled async
        self.module = ModelModule(backend.model_file(), f"model '{config.name}'")
        args = {
            "model_config": config_to_triton_json(config),
            "model_instance_kind": spec.kind,
            "model_instance_name": self.info.instance_name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(backend.version_path.parent),
            "model_version": str(backend.version),
            "model_name": config.name,
        }
        try:
            with self._running():
                self.model = self.module.model_class()
                init = getattr(self.model, "initialize", None)
                if init is not None:
                    self._call(init, args)
        except Exception as exc:
            self.module.unload()
            raise ConfigError(f"model '{config.name}': initialize failed: {type(exc).__name__}: {exc}") from None

    @contextmanager
    def _running(self) -> Iterator[None]:
        with context.running(self.info), self.module.active():
            yield

    def _call(self, fn: Any, *args: Any) -> Any:
        """Call a model method; coroutine functions run on this instance's private loop."""
        result = fn(*args)
        if inspect.iscoroutine(result):
            return self._private_loop().run_until_complete(result)
        return result

    def _private_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    # ---- execute -------------------------------------------------------------------------------
    def execute(self, batch: Batch) -> list[RequestResult]:
        t0 = time.perf_counter_ns()
        states = []
        requests = []
        for core in batch.requests:
            wanted = frozenset(core.requested_outputs) if core.requested_outputs is not None else None
            state = RequestState(core, self.decoupled, wanted)
            states.append(state)
            requests.append(InferenceRequest._incoming(core, state, self.output_names, self.version))
        t1 = time.perf_counter_ns()
        try:
            with self._running():
                execute = getattr(self.model, "execute", None)
                if execute is None:
                    raise TritonModelException(
                        f"Python model {self.backend.model_file()} does not implement `execute` method."
                    )
                returned = execute(requests)
                if inspect.iscoroutine(returned):
                    if self.decoupled:
                        self._run_in_background(returned, states)
                        returned = None
                    else:
                        returned = self._private_loop().run_until_complete(returned)
        except Exception as exc:  # fails every request of this call that is not complete yet
            results = self._fail_all(states, exception_text(exc))
        else:
            results = self._collect(returned, states)
        t2 = time.perf_counter_ns()
        batch.timings.compute_input_ns = t1 - t0
        batch.timings.compute_infer_ns = t2 - t1
        return results

    def _collect(self, returned: Any, states: list[RequestState]) -> list[RequestResult]:
        if self.decoupled:
            if returned is not None:
                return self._fail_all(
                    states,
                    f"Python model '{self.info.instance_name}' is using the decoupled mode and the execute function "
                    "must return None.",
                )
            return [s.result() for s in states]
        if returned is None:  # every request answers through its response sender
            return [s.result() for s in states]
        if not isinstance(returned, list):
            return self._fail_all(states, f"Expected a list in the execute return, found type '{type(returned)}'.")
        if len(returned) != len(states):
            return self._fail_all(
                states,
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(states)}, and InferenceResponse(s) size is:{len(returned)}\n",
            )
        for item in returned:
            if item is not None and not isinstance(item, InferenceResponse):
                return self._fail_all(
                    states,
                    "Expected an 'InferenceResponse' object in the execute function return list, found type "
                    f"'{type(item)}'.",
                )
        return [s.result() if item is None else s.answer(item) for item, s in zip(returned, states, strict=True)]

    def _fail_all(self, states: list[RequestState], message: str) -> list[RequestResult]:
        text = f"Failed to process the request(s) for model '{self.info.instance_name}', message: {message}"
        log.error("%s", text)
        error = BackendError(text)
        for state in states:
            state.fail(error)
        return [s.result() for s in states]

    # ---- decoupled async execute ---------------------------------------------------------------
    def _run_in_background(self, coroutine: Any, states: list[RequestState]) -> None:
        loop = self._background_loop()
        running: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, loop)

        def finished(f: Future[Any]) -> None:
            if f.cancelled():
                self._fail_all(states, "execute was cancelled: the model is unloading")
            elif f.exception() is not None:
                self._fail_all(states, exception_text(f.exception()))  # type: ignore[arg-type]
            elif f.result() is not None:
                self._collect(f.result(), states)

        running.add_done_callback(finished)

    def _background_loop(self) -> asyncio.AbstractEventLoop:
        if self._background is None:
            loop = asyncio.new_event_loop()

            def run() -> None:
                context.enter(self.info)
                enter_module(self.module)
                asyncio.set_event_loop(loop)
                loop.run_forever()

            thread = threading.Thread(target=run, name=f"{self.info.instance_name}-async", daemon=True)
            thread.start()
            self._background = (loop, thread)
        return self._background[0]

    def close(self) -> None:
        try:
            fin = getattr(self.model, "finalize", None)
            if fin is not None:
                with self._running():
                    try:
                        self._call(fin)
                    except Exception:
                        log.exception("model '%s': finalize failed", self.model_name)
        finally:
            if self._background is not None:
                loop, thread = self._background
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=30)
                loop.close()
            if self._loop is not None:
                self._loop.close()
            self.module.unload()
            self.backend.instance_closed()


def exception_text(exc: BaseException) -> str:
    """``<Type>: <message>`` and the model's frames, innermost first, as pybind11 formats a Python error."""
    message = exc.message() if isinstance(exc, TritonModelException) else str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    while frames and frames[0].filename.startswith(_OWN_FILES):
        frames.pop(0)  # the backend's own frames (and asyncio's), above the model's code
    text = f"{type(exc).__name__}: {message}"
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text
