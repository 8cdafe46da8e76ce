"""The responses of one request as a stream: what decoupled models produce and streaming front ends send.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a request with zero, one or
many responses, sent whenever it likes (from ``execute`` or later, from any thread), the last one marked
final. ``ResponseStream`` carries them from the backend to whoever asked: the gRPC ``ModelStreamInfer``
handler, HTTP ``generate``/``generate_stream``, or a BLS caller. It is protocol-neutral: items hold
``InferenceResponse`` objects or typed errors, and each front end encodes them its own way.

Producers (backend threads) call ``send``; there is one consumer, either on the event loop (``async for``)
or on a thread (``next_blocking``, BLS inside a model). A flag-only final (``send(None, final=True)``,
Triton's ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` without a response) is an item with no response, so a
front end can choose to forward it (gRPC ``triton_enable_empty_final_response``) or not.

``cancel`` is the consumer saying nobody will read further (client cancelled, connection closed): the
request is marked cancelled, which the model sees through ``is_cancelled()``, and the runtime's cancel
hooks run (a request still queued is dropped without executing).

Unary inference never builds one of these: the non-decoupled hot path stays one awaited result.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ServerError
from .types import InferenceRequest, InferenceResponse


@dataclass(slots=True)
class StreamItem:
    #: None for a flag-only final, or when ``error`` is set
    response: InferenceResponse | None
    error: ServerError | None = None
    #: the last item of the stream (Triton's ``triton_final_response``)
    final: bool = False


class ResponseStream:
    def __init__(self, request: InferenceRequest, model_name: str, model_version: str) -> None:
        self.request = request
        self.model_name = model_name
        self.model_version = model_version
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._lock = threading.Condition()
        self._items: deque[StreamItem] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: the final item was sent (producer side)
        self.finished = False
        #: ``time.monotonic_ns()`` when the first response or error was sent (0: none yet; a flag-only final
        #: is not a response): the request's first-response time in the metrics
        self.first_ns = 0
        #: the final item was read (consumer side)
        self._ended = False
        self.cancelled = False
        self._on_cancel: list[Callable[[], Any]] = []
        #: applied to every response's outputs in ``send`` (the model's shapes → its clients', the config's
        #: ``reshape``), for models that send their responses themselves; a ServerError it raises is sent
        #: as that response's error
        self.shape_outputs: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    # ---- producer side: any thread ---------------------------------------------------------
    def send(
        self,
        outputs: dict[str, np.ndarray] | None,
        *,
        error: ServerError | None = None,
        final: bool = False,
        parameters: dict[str, Any] | None = None,
    ) -> bool:
        """Queue one response (or error); False when the stream was already finished (nothing queued)."""
        response = None
        if outputs is not None and error is None and self.shape_outputs is not None:
            try:
                outputs = self.shape_outputs(outputs)
            except ServerError as exc:
                outputs, error = None, exc
        if outputs is not None and error is None:
            response = InferenceResponse(
                self.model_name, self.model_version, outputs, self.request.id, parameters or {}
            )
        with self._lock:
            if self.finished:
                return False
            self._items.append(StreamItem(response, error, final))
            self.finished = final
            if not self.first_ns and (response is not None or error is not None):
                self.first_ns = time.monotonic_ns()
            waiter, self._waiter = self._waiter, None
            self._lock.notify_all()
        if waiter is not None:
            if threading.get_ident() == self._loop_thread:
                _wake(waiter)
            else:
                try:
                    self._loop.call_soon_threadsafe(_wake, waiter)
                except RuntimeError:  # the loop is closed: the server is gone, nobody reads
                    pass
        return True

    def fail(self, error: ServerError) -> bool:
        """End the stream with ``error`` as its final item."""
        return self.send(None, error=error, final=True)

    # ---- consumer side ----------------------------------------------------------------------
    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> StreamItem:
        while True:
            with self._lock:
                if self._items:
                    return self._pop()
                if self._ended:
                    raise StopAsyncIteration
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def next_blocking(self, timeout: float | None = None) -> StreamItem:
        """The next item for a consumer on a thread (BLS); StopIteration after the final one."""
        with self._lock:
            while not self._items:
                if self._ended:
                    raise StopIteration
                if not self._lock.wait(timeout):
                    raise TimeoutError("no response within the timeout")
            return self._pop()

    def _pop(self) -> StreamItem:
        item = self._items.popleft()
        if item.final:
            self._ended = True
        return item

    def cancel(self) -> None:
        """Nobody reads any more: mark the request cancelled and run the cancel hooks (once)."""
        if self.cancelled:
            return
        self.cancelled = True
        self.request.cancelled = True
        for hook in self._on_cancel:
            hook()

    def on_cancel(self, hook: Callable[[], Any]) -> None:
        self._on_cancel.append(hook)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
