"""A Python model instance in its own stub process, as Triton runs one: isolation, and restarts.

``start`` copies the batch's input tensors into the instance's shared memory and sends one message, at
once, on the server loop (the instance pool calls it there); the callback that reads the stub's answer
hands the results back, so the instance can take its next batch in the same loop turn.

When the stub dies (a segfault, ``os._exit``, the OOM killer) or misses a health check, only the
requests it held fail, with Triton 2.51's text (``Stub process '<instance>' is not healthy.``, INTERNAL);
the instance leaves the pool's rotation until its next stub serves (the other instances take the work;
with none left, requests wait in the queue). The instance reports not ready (so does its
model, and the repository index says why) and a new stub starts: at once the first time, then after a
doubling delay. More than ``RESTART_LIMIT`` deaths within ``RESTART_WINDOW`` seconds and the instance
gives up: not ready, every request fails with that text, until the model is loaded again. Each step is
logged. Unloading ends the process, and its memory goes with it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ....config import ConfigError
from ....vocabulary.custom_metrics import CustomMetrics
from ....vocabulary.errors import BackendError
from ....vocabulary.registry_view import RegistryView
from ...base import BackendInstance, Batch, RequestResult, Rescheduled
from .. import ipc
from ..model_api import context
from ..model_api.pb_request import RESCHEDULED
from . import bridge
from .stub_process import Launch, Pending, StubLost, StubProcess, exit_description

log = logging.getLogger(__name__)

#: deaths within RESTART_WINDOW seconds after which an instance stops restarting its stub
RESTART_LIMIT = 5
RESTART_WINDOW = 60.0
#: the longest wait between two restarts, in seconds
RESTART_DELAY_MAX = 10.0
#: how long ``finalize`` may take when the model unloads, in seconds
FINALIZE_TIMEOUT = 60.0


class StubInstance(BackendInstance):
    """One instance: its stub process (replaced when it dies) on the server loop."""

    def __init__(
        self,
        backend: Any,
        info: context.InstanceInfo,
        args: dict[str, str],
        launch: Launch,
        loop: asyncio.AbstractEventLoop,
        registry: RegistryView | None,
        metrics: CustomMetrics,
    ) -> None:
        config = backend.config
        self.backend = backend
        self.info = info
        self.name = info.instance_name
        self.args = args
        self.launch = launch
        self.loop = loop
        self.registry = registry
        self.metrics = metrics
        self.decoupled = config.model_transaction_policy.decoupled
        self.output_names: list[str] = backend.output_names()
        #: what goes out when a request names no outputs: every output the config names (Triton's
        #: python backend drops the others)
        self.all_outputs = frozenset(self.output_names)
        self.version = backend.version
        self.label = f"model '{config.name}'"
        self.closing = False
        #: why the instance is not ready ("" while it serves)
        self.reason = ""
        self.gave_up = False
        self._deaths: list[float] = []
        self._serving = asyncio.Event()
        self._waiting_for_ready: list[Callable[[], None]] = []
        self._restart: asyncio.Task[None] | None = None
        self.proc: StubProcess | None = None
        try:
            self.proc = asyncio.run_coroutine_threadsafe(self._start(), loop).result()
        except _StartFailed as exc:
            raise ConfigError(str(exc)) from None
        loop.call_soon_threadsafe(self._serving.set)

    # ---- readiness -------------------------------------------------------------------------------
    def ready(self) -> bool:
        return not self.reason

    def unready_reason(self) -> str:
        return self.reason

    def when_ready(self, callback: Callable[[], None]) -> bool:
        if self._serving.is_set():
            return False
        self._waiting_for_ready.append(callback)
        return True

    def _set_serving(self) -> None:
        """Serving again (or given up, so that waiting requests fail now)."""
        self._serving.set()
        callbacks, self._waiting_for_ready = self._waiting_for_ready, []
        for callback in callbacks:
            callback()

    # ---- the process ----------------------------------------------------------------------------
    async def _start(self) -> StubProcess:
        proc = StubProcess(
            self.loop, self.name, self.launch, self.registry, self.metrics, self.info.metrics_owner, self._lost
        )
        try:
            await proc.spawn()
        except OSError as exc:
            raise _StartFailed(f"{self.label}: cannot start a stub process for '{self.name}': {exc}") from None
        message = {
            "op": "init",
            "model_name": self.info.model_name,
            "model_version": self.info.model_version,
            "instance_name": self.name,
            "version_dir": str(self.info.version_dir),
            "model_file": str(self.backend.model_file()),
            "code": base64.b64encode(self.backend.code).decode(),
            "label": self.label,
            "decoupled": self.decoupled,
            "args": self.args,
        }
        try:
            answer = await proc.request(message, ("ready", "init_failed"))
        except StubLost:
            status = await proc.reap(5.0)
            raise _StartFailed(
                f"{self.label}: the stub process of '{self.name}' {exit_description(status)} during initialize "
                "(its output is in the server log)"
            ) from None
        if answer["op"] == "init_failed":
            await proc.stop(finalize=False, timeout=0)
            raise _StartFailed(str(answer["m"]))
        log.info("instance '%s' runs in stub process %d", self.name, proc.pid)
        return proc

    def _lost(self, proc: StubProcess, reason: str) -> None:
        """``proc`` died or was ended (on the loop)."""
        if self.closing or proc is not self.proc:
            return
        self._serving.clear()
        self.loop.create_task(self._after_death(proc, reason))

    async def _after_death(self, proc: StubProcess, reason: str) -> None:
        status = await proc.reap(5.0)
        if reason == "exited":
            reason = exit_description(status)
        proc.fail_pending(self.unhealthy_text())
        proc.arena.close()
        proc.segments.close()
        self._died(f"the stub process of instance '{self.name}' (pid {proc.pid}) {reason}")

    def _died(self, what: str) -> None:
        """Count a death and restart (with a doubling delay), or give up after too many."""
        if self.closing:
            return
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW] + [now]
        deaths = len(self._deaths)
        if deaths > RESTART_LIMIT:
            self.gave_up = True
            self.reason = (
                f"{what}; it died {deaths} times in {RESTART_WINDOW:.0f} s and is not restarted (load the model again)"
            )
            log.error("%s", self.reason)
            self._set_serving()  # requests waiting for it fail now
            return
        delay = 0.0 if deaths == 1 else min(RESTART_DELAY_MAX, 0.5 * 2 ** (deaths - 2))
        self.reason = f"{what}; restart {deaths} in {delay:.1f} s"
        log.error("%s", self.reason)
        self._restart = self.loop.create_task(self._restart_after(delay))

    async def _restart_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.closing:
            return
        try:
            proc = await self._start()
        except _StartFailed as exc:
            self._died(f"instance '{self.name}' could not be restarted: {exc}")
            return
        if self.closing:
            await proc.stop(finalize=True, timeout=FINALIZE_TIMEOUT)
            return
        self.proc = proc
        self.reason = ""
        log.warning("instance '%s' serves again (stub process %d)", self.name, proc.pid)
        self._set_serving()

    def unhealthy_text(self) -> str:
        """What requests a dead stub held get: Triton 2.51's text (seen with a segfaulting and with a stopped
        stub; 2.51 then fails every later request the same way and never restarts the stub)."""
        return f"Stub process '{self.name}' is not healthy."

    # ---- execute ---------------------------------------------------------------------------------
    @property
    def async_loop(self) -> asyncio.AbstractEventLoop:
        """``start`` runs on this loop (the instance pool calls it there directly)."""
        return self.loop

    def execute(self, batch: Batch) -> list[RequestResult]:
        """From a thread: the batch runs on the loop."""

        async def run() -> list[RequestResult]:
            future: asyncio.Future[list[RequestResult]] = self.loop.create_future()
            self.start(batch, future.set_result)  # called once
            return await future

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def start(self, batch: Batch, done: Callable[[list[RequestResult]], None]) -> None:
        """On the loop: the batch goes to the stub at once; ``done(results)`` is called once, on the loop,
        from the callback that read the stub's answer. While a restart is on its way, the batch goes once
        the new stub serves."""
        if not self._serving.is_set():
            self.loop.create_task(self._after_restart(batch, done))
            return
        self._send(batch, done)

    async def _after_restart(self, batch: Batch, done: Callable[[list[RequestResult]], None]) -> None:
        await self._serving.wait()
        self._send(batch, done)

    def _send(self, batch: Batch, done: Callable[[list[RequestResult]], None]) -> None:
        t0 = time.perf_counter_ns()
        proc = self.proc
        if self.gave_up or proc is None or proc.lost is not None:
            done([BackendError(self.unhealthy_text())] * len(batch.requests))
            return
        results: list[RequestResult] = [None] * len(batch.requests)
        wire: list[dict[str, Any]] = []
        sent: list[tuple[int, int, Pending]] = []  # (index in batch, key, record)
        for i, core in enumerate(batch.requests):
            wanted = frozenset(core.requested_outputs) if core.requested_outputs is not None else self.all_outputs
            try:
                descs = ipc.write_tensors(proc.arena, core.inputs.items())
            except ipc.ShmError as exc:
                results[i] = BackendError(
                    f"Failed to process the request(s) for model instance '{self.name}', message: {exc}"
                )
                continue
            key = proc.next_key()
            record = Pending(core, self.decoupled, wanted)
            proc.pending[key] = record
            sent.append((i, key, record))
            wire.append(
                {
                    "k": key,
                    "f": bridge.incoming_fields(core, self.output_names, self.version),
                    "in": descs,
                    "w": sorted(wanted) if wanted is not None else None,
                }
            )
        t1 = time.perf_counter_ns()
        batch.timings.compute_input_ns = t1 - t0
        if not wire:
            done(results)
            return

        def answered(answers: list[Any] | StubLost) -> None:
            t2 = time.perf_counter_ns()
            if isinstance(answers, StubLost):  # the stub died with this batch: its requests get Triton's text
                answers = [None] * len(sent)
                proc.fail_pending(self.unhealthy_text())
            if len(answers) != len(sent):  # not what was asked: the stub is not to be trusted any more
                proc.kill()
                answers = [None] * len(sent)
                proc.fail_pending(self.unhealthy_text())
            for (i, key, record), answer in zip(sent, answers, strict=True):
                results[i] = self._result(proc, key, record, answer)
            batch.timings.compute_infer_ns = t2 - t1
            batch.timings.compute_output_ns = time.perf_counter_ns() - t2
            done(results)

        proc.execute(wire, answered)

    def _result(self, proc: StubProcess, key: int, record: Pending, answer: Any) -> RequestResult:
        if answer == RESCHEDULED:  # released with RELEASE_RESCHEDULE: its next execution sends it again
            proc.pending.pop(key, None)
            return Rescheduled(self.info.model_name)
        if isinstance(answer, dict):  # execute returned this request's response
            proc.pending.pop(key, None)
            try:
                return proc.outputs(answer, record.wanted)
            except (ValueError, TypeError, KeyError) as exc:
                return BackendError(f"model '{self.info.model_name}' sent an unreadable response: {exc}")
        done: Future[Any] = record.done
        if done.done():  # answered (or failed) through its sender before execute returned
            proc.pending.pop(key, None)
            return done.result()  # type: ignore[no-any-return]
        return done

    # ---- unload -----------------------------------------------------------------------------------
    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result()
        finally:
            self.backend.instance_closed()

    async def _close(self) -> None:
        self.closing = True
        if self._restart is not None:
            self._restart.cancel()
        proc = self.proc
        if proc is not None:
            await proc.stop(finalize=True, timeout=FINALIZE_TIMEOUT)
            proc.fail_pending(f"model '{self.info.model_name}' unloaded")


class _StartFailed(Exception):
    pass
