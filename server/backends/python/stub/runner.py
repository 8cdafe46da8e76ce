"""One model instance's ``TritonPythonModel``: ``initialize``, ``execute``, ``finalize``, as Triton's stub
runs them. The same code runs in a stub process (``stub``) and in the server's own process (``inprocess``).

``execute`` follows Triton's stub (python_backend src/pb_stub.cc ``ProcessRequests`` and
``ProcessRequestsDecoupled``, messages checked against Triton 2.51):

* non-decoupled: a list with one ``InferenceResponse`` per request, where ``None`` (or returning ``None``
  altogether) means the request answers through its response sender, possibly after ``execute`` returns;
  a coroutine ``execute`` runs to completion on the instance's background event loop (which keeps
  running, so tasks it started may answer after it returned, as Triton's stub runs it);
* decoupled: ``execute`` returns ``None`` and every response goes through the senders, from ``execute``
  or from any thread later; an ``async def execute`` runs on the instance's background event loop, so
  the instance takes the next requests while earlier coroutines still answer;
* an exception (or a wrong return value) fails every request not yet complete with
  ``Failed to process the request(s) for model '<instance>', message: <Type>: <message>`` plus the
  traceback in pybind11's ``At:`` form, and the same text goes to the server log.

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..model_api import context
from ..model_api.pb_request import RESCHEDULED, InferenceRequest, SenderState
from ..model_api.pb_types import InferenceResponse, Logger, TritonModelException
from .loader import ModelModule, enter_module

_OWN_FILES = (str(Path(__file__).parent), str(Path(asyncio.__file__).parent), str(Path(futures.__file__).parent))


class InitializeError(Exception):
    """``initialize`` raised (the load fails with ``initialize failed: <Type>: <message>``)."""


class ModelRunner:
    """Loads ``model.py`` for one instance and runs its methods with the instance marked as running."""

    def __init__(
        self, info: context.InstanceInfo, model_file: Path, label: str, decoupled: bool, code: bytes | None = None
    ) -> None:
        self.info = info
        self.model_file = model_file
        self.decoupled = decoupled
        self._loop: asyncio.AbstractEventLoop | None = None  # coroutine initialize/execute/finalize
        self._background: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None  # decoupled async
        self.module = ModelModule(model_file, label, code)
        self.model: Any = None

    def initialize(self, args: dict[str, str]) -> None:
        try:
            with self.running():
                self.model = self.module.model_class()
                init = getattr(self.model, "initialize", None)
                if init is not None:
                    self._call(init, args)
        except Exception as exc:
            self.module.unload()
            raise InitializeError(f"{type(exc).__name__}: {exc}") from None

    @contextmanager
    def running(self) -> Iterator[None]:
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
    def execute(self, requests: list[InferenceRequest], states: list[SenderState]) -> list[Any]:
        """Run ``execute``; per request what its state reports (``SenderState.answer``/``result``)."""
        try:
            with self.running():
                execute = getattr(self.model, "execute", None)
                if execute is None:
                    raise TritonModelException(f"Python model {self.model_file} does not implement `execute` method.")
                returned = execute(requests)
                if inspect.iscoroutine(returned):
                    if self.decoupled:
                        self._run_in_background(returned, states)
                        returned = None
                    else:  # on the loop that keeps running: tasks it starts go on after it returns
                        returned = asyncio.run_coroutine_threadsafe(returned, self._background_loop()).result()
        except Exception as exc:  # fails every request of this call that is not complete yet
            return self._fail_all(states, exception_text(exc))
        results = self._collect(returned, states, requests)
        # released with RELEASE_RESCHEDULE and not complete: the scheduler executes it again (python_backend
        # releases it with the model's flags once execute returned); one that is complete ended its stream
        return [
            RESCHEDULED if request._rescheduled() and not state.closed else result
            for request, state, result in zip(requests, states, results, strict=True)
        ]

    def _collect(
        self, returned: Any, states: list[SenderState], requests: list[InferenceRequest] | None = None
    ) -> list[Any]:
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
        rescheduled = [r._rescheduled() for r in requests] if requests is not None else [False] * len(states)
        # a rescheduled request's response is dropped, as python_backend deletes it (it answers in a later execution)
        return [
            s.result() if item is None or again else s.answer(item)
            for item, s, again in zip(returned, states, rescheduled, strict=True)
        ]

    def _fail_all(self, states: list[SenderState], message: str) -> list[Any]:
        text = f"Failed to process the request(s) for model '{self.info.instance_name}', message: {message}"
        Logger.log_error(text)
        for state in states:
            state.fail(text)
        return [s.result() for s in states]

    # ---- decoupled async execute ---------------------------------------------------------------
    def _run_in_background(self, coroutine: Any, states: list[SenderState]) -> None:
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

    # ---- finalize ------------------------------------------------------------------------------
    def finalize(self) -> None:
        try:
            fin = getattr(self.model, "finalize", None)
            if fin is not None:
                with self.running():
                    try:
                        self._call(fin)
                    except Exception as exc:
                        Logger.log_error(
                            f"model '{self.info.model_name}': finalize failed: {type(exc).__name__}: {exc}"
                        )
        finally:
            if self._background is not None:
                loop, thread = self._background
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=30)
                loop.close()
            if self._loop is not None:
                self._loop.close()
            self.module.unload()


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
