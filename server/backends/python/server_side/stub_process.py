"""The server's end of one stub process: spawning it, its channel, and everything it asks of the server.

Runs on the server's event loop: the socket is read with ``loop.add_reader``, so an ``execute`` costs the
loop two socket operations and no thread hand-off. What the stub sends is untrusted (a model's code
runs there): it is read as JSON, tensor descriptors are bounds-checked against the stub's own segments
(``ipc.SegmentReader``), and a malformed message ends the stub like a crash. The server maps no shared
memory (``ipc``): a segment the stub truncated fails the tensor that lies past its end, never the server.

What it serves: BLS requests (through the registry, with the in-process backend's checks and texts:
``bridge``), ``is_model_ready``, ``load_model``/``unload_model``, custom metrics (handles per stub,
released when it goes), ``Logger`` lines, ``is_cancelled()``, and the responses of requests it executes.
Health: a ping every ``health_interval`` seconds that must be answered within ``timeout`` seconds (the
stub's reader thread answers, so a model busy in ``execute`` is not unhealthy, a wedged or stopped
process is).
"""

from __future__ import annotations

import array
import asyncio
import itertools
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ....vocabulary import custom_metrics as store
from ....vocabulary.errors import BackendError, ServerError
from ....vocabulary.registry_view import RegistryView
from ....vocabulary.types import InferenceRequest as CoreRequest
from .. import ipc
from . import bridge

log = logging.getLogger(__name__)
model_log = logging.getLogger("kubeinfer.python_model")

BOOT = Path(__file__).parents[1] / "stub" / "stub_boot.py"
_KINDS = {0: store.COUNTER, 1: store.GAUGE, 2: store.HISTOGRAM}
_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
#: seconds a block the server read may wait to be freed with others (the next execute takes them at once)
FREE_DELAY = 0.05


@dataclass(frozen=True)
class Launch:
    """How to start a stub: the interpreter and its environment (``EXECUTION_ENV_PATH``), and limits."""

    python: str
    env: dict[str, str]
    #: seconds a stub has to answer a health check (Triton's ``stub-timeout-seconds``)
    timeout: float = 30.0
    #: seconds between health checks
    health_interval: float = 5.0
    #: bytes of the first shared-memory segment each way per stub (Triton's ``shm-default-byte-size``)
    arena_bytes: int = 1 << 20


class StubLost(Exception):
    """The stub process died or was ended; the message says how."""


@dataclass
class Pending:
    """A request the stub executes that is not complete yet."""

    core: CoreRequest
    decoupled: bool
    wanted: frozenset[str] | None
    done: Future[Any] = field(default_factory=Future)


class StubProcess:
    """One stub process. ``on_lost(process, reason)`` is called once when it dies or stops answering."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        launch: Launch,
        registry: RegistryView | None,
        metrics: store.CustomMetrics,
        metrics_owner: str,
        on_lost: Callable[[StubProcess, str], None],
    ) -> None:
        self.loop = loop
        self.name = name
        self.launch = launch
        self.registry = registry
        self.metrics = metrics
        self.metrics_owner = metrics_owner
        self.on_lost = on_lost
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.pid = 0
        self.lost: str | None = None
        self.closing = False
        self._decoder = ipc.Decoder(orjson.loads)
        self._fds: list[int] = []
        self._out: list[tuple[bytes, tuple[int, ...]]] = []
        self._frees: list[list[int]] = []
        self._flush_scheduled = False
        self._loop_thread = 0
        self.arena = ipc.Arena(launch.arena_bytes, self._announce, self._retire, mapped=False)
        self.segments = ipc.SegmentReader(self._release)
        self._ids = itertools.count(1)
        self.pending: dict[int, Pending] = {}
        #: what to call with each ``execute``'s answer (or StubLost), by its id
        self._execs: dict[int, Callable[[list[Any] | StubLost], None]] = {}
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._bls: dict[int, asyncio.Task[None]] = {}
        self._families: dict[int, store.CustomFamily] = {}
        self._metrics: dict[int, tuple[store.CustomFamily, store.CustomMetric]] = {}
        self._ping = 0
        self._health: asyncio.TimerHandle | None = None

    # ---- start and stop ------------------------------------------------------------------------
    async def spawn(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = await asyncio.to_thread(
                subprocess.Popen,
                [self.launch.python, str(BOOT), str(child.fileno()), str(self.launch.arena_bytes)],
                pass_fds=(child.fileno(),),
                env=self.launch.env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C is the server's to handle, not each model's
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid = self.proc.pid
        self._loop_thread = threading.get_ident()
        parent.setblocking(False)
        self.sock = parent
        self.loop.add_reader(parent.fileno(), self._on_readable)
        self._health = self.loop.call_later(self.launch.health_interval, self._health_check)

    async def request(
        self, message: dict[str, Any], reply_ops: tuple[str, ...], timeout: float | None = None
    ) -> dict[str, Any]:
        """Send ``message`` and wait for the stub's answer, a message named one of ``reply_ops``."""
        if self.lost is not None:
            raise StubLost(self.lost)
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        for op in reply_ops:
            self._replies[op] = future
        self.send(message)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            for op in reply_ops:
                self._replies.pop(op, None)

    async def stop(self, finalize: bool, timeout: float) -> None:
        """Unload: ``finalize`` (bounded by ``timeout``), then the process ends and its memory with it."""
        if finalize and self.lost is None:
            try:
                await self.request({"op": "fin"}, ("finalized",), timeout)
            except asyncio.TimeoutError:
                log.warning("stub process '%s' (pid %d): finalize ran over %.0f s", self.name, self.pid, timeout)
            except StubLost:
                pass
        self.closing = True
        self._lose("stopped")  # closing our end makes the stub exit (its reader thread sees the end of stream)
        await self.reap(10.0)
        self.arena.close()
        self.segments.close()

    async def reap(self, grace: float) -> int | None:
        """Wait for the process to exit (SIGKILL after ``grace`` seconds); its exit status."""
        proc = self.proc
        if proc is None:
            return None
        try:
            return await asyncio.to_thread(proc.wait, grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            return await asyncio.to_thread(proc.wait)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ---- the channel ---------------------------------------------------------------------------
    def send(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        sock = self.sock
        if sock is None:
            return
        data = ipc.frame(message, orjson.dumps)
        if self._out:
            self._out.append((data, fds))
            return
        self._write(sock, data, fds)

    def _write(self, sock: socket.socket, data: bytes, fds: tuple[int, ...]) -> bool:
        try:
            if fds:
                sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
            else:
                sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._lose(f"its channel failed ({exc.strerror})")
            return False
        if sent < len(data):
            self._out.insert(0, (data[sent:], fds if sent == 0 else ()))
            self.loop.add_writer(sock.fileno(), self._on_writable)
            return False
        return True

    def _on_writable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        self.loop.remove_writer(sock.fileno())
        while self._out:
            data, fds = self._out.pop(0)
            if not self._write(sock, data, fds):
                return

    def _on_readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data = ipc.recv(sock, self._fds)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lose("exited")
            return
        try:
            for message in self._decoder.feed(data):
                self._dispatch(message)
        except Exception as exc:
            log.error("stub process '%s' (pid %d) sent what cannot be read: %r", self.name, self.pid, exc)
            self.kill()
            self._lose(f"sent a malformed message ({type(exc).__name__}: {exc})")

    def _lose(self, reason: str) -> None:
        """The channel is gone: everything waiting on this stub fails, once."""
        if self.lost is not None:
            return
        self.lost = reason
        sock, self.sock = self.sock, None
        if sock is not None:
            self.loop.remove_reader(sock.fileno())
            self.loop.remove_writer(sock.fileno())
            sock.close()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._health is not None:
            self._health.cancel()
        error = StubLost(reason)
        for future in set(self._replies.values()):
            if not future.done():
                future.set_exception(error)
        for task in self._bls.values():
            task.cancel()
        self._bls.clear()
        for family, metric in self._metrics.values():
            self.metrics.release_metric(family, metric)
        for family in self._families.values():
            self.metrics.release_family(family, self.metrics_owner)
        self._metrics.clear()
        self._families.clear()
        self.on_lost(self, reason)  # first: the instance leaves the rotation before its slot is given back
        answers, self._execs = self._execs, {}
        for answer in answers.values():
            self._call(answer, error)

    def _call(self, answer: Callable[[list[Any] | StubLost], None], value: list[Any] | StubLost) -> None:
        """Hand an execute's answer on; a failure there is the server's bug, never the stub's doing."""
        try:
            answer(value)
        except Exception:
            log.exception("stub process '%s' (pid %d): handling an execute's answer failed", self.name, self.pid)

    def fail_pending(self, message: str) -> None:
        """Requests this stub left unanswered get ``message`` (it died: Triton's text)."""
        pending, self.pending = self.pending, {}
        error = BackendError(message)
        for record in pending.values():
            if record.done.done():
                continue
            if record.decoupled:
                if record.core.stream is not None:  # None: a sequence batcher's filler row, never answered
                    record.core.stream.fail(error)
                record.done.set_result(None)
            else:
                record.done.set_result(error)

    # ---- shared memory -------------------------------------------------------------------------
    def _announce(self, sid: int, fd: int, size: int) -> None:
        self.send({"op": "seg", "s": sid, "z": size}, (fd,))

    def _retire(self, sid: int) -> None:
        self.send({"op": "drop", "s": sid})

    def _release(self, sid: int, offset: int) -> None:
        """A view of a stub block died here (any thread): tell the stub soon, with the others (or with the
        next ``execute``, whichever comes first)."""
        self._frees.append([sid, offset])
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                if threading.get_ident() == self._loop_thread:
                    self.loop.call_later(FREE_DELAY, self._flush_frees)
                else:
                    self.loop.call_soon_threadsafe(self.loop.call_later, FREE_DELAY, self._flush_frees)
            except RuntimeError:  # the loop is closed: the server is stopping
                pass

    def _take_frees(self) -> list[list[int]]:
        frees, self._frees = self._frees, []
        return frees

    def _flush_frees(self) -> None:
        self._flush_scheduled = False
        frees = self._take_frees()
        if frees and self.lost is None:
            self.send({"op": "free", "b": frees})

    def outputs(self, wire: dict[str, Any], wanted: frozenset[str] | None) -> dict[str, Any] | ServerError:
        if "e" in wire:
            code, message = wire["e"]
            return bridge.error_of(str(code), str(message))
        try:
            tensors = [(str(desc[0]), self.segments.array(desc)) for desc in wire.get("o", ())]
        except ipc.SegmentUnreadable as exc:  # this response is lost; the server and the other requests are not
            log.error("stub process '%s' (pid %d): %s", self.name, self.pid, exc)
            return BackendError(f"Python model instance '{self.name}' sent an output the server cannot read: {exc}")
        return bridge.outputs_or_error(tensors, None, wanted)

    # ---- execute ---------------------------------------------------------------------------------
    def execute(self, requests: list[dict[str, Any]], answer: Callable[[list[Any] | StubLost], None]) -> None:
        """Send one ``execute`` now. ``answer`` gets the stub's per-request results (a response, or None:
        answered apart), or StubLost if the stub goes first: once, on the loop, from the very callback that
        read the answer (no loop turn in between: the instance may take its next batch at once)."""
        if self.lost is not None:
            answer(StubLost(self.lost))
            return
        exec_id = next(self._ids)
        self._execs[exec_id] = answer
        message: dict[str, Any] = {"op": "exec", "id": exec_id, "reqs": requests}
        if self._frees:
            message["fr"] = self._take_frees()
        self.send(message)

    def next_key(self) -> int:
        return next(self._ids)

    # ---- what the stub sends ---------------------------------------------------------------------
    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "done":
            answer = self._execs.pop(message["id"], None)
            if answer is not None:
                results = message["res"]
                if not isinstance(results, list):
                    raise ValueError("an execute's results must be a list")
                self._call(answer, results)
        elif op == "deliver":
            self._on_deliver(message)
        elif op == "fail":
            record = self.pending.pop(message["k"], None)
            if record is not None and not record.done.done():
                error = BackendError(str(message["m"]))
                if record.decoupled:
                    if record.core.stream is not None:  # None: a filler row
                        record.core.stream.fail(error)
                    record.done.set_result(None)
                else:
                    record.done.set_result(error)
        elif op == "free":
            for sid, offset in message["b"]:
                self.arena.free(int(sid), int(offset))
        elif op == "seg":
            self.segments.add(int(message["s"]), self._fds.pop(0), int(message["z"]))
        elif op == "drop":
            self.segments.drop(int(message["s"]))
        elif op == "pong":
            self._on_pong(message.get("n"))
        elif op == "log":
            model_log.log(_LEVELS.get(int(message.get("l", 0)), logging.INFO), "%s", message.get("m", ""))
        elif op == "call":
            self._on_call(message)
        elif op == "bls":
            self._on_bls(message)
        elif op == "unfamily":
            family = self._families.pop(message["h"], None)
            if family is not None:
                self.metrics.release_family(family, self.metrics_owner)
        elif op == "unmetric":
            entry = self._metrics.pop(message["h"], None)
            if entry is not None:
                self.metrics.release_metric(*entry)
        else:
            reply = self._replies.get(op)
            if reply is None:
                raise ValueError(f"unexpected message {op!r}")
            if not reply.done():
                reply.set_result(message)

    def _on_deliver(self, message: dict[str, Any]) -> None:
        key = message["k"]
        record = self.pending.get(key)
        if record is None or record.done.done():
            return
        wire, final = message["r"], bool(message["f"])
        if not record.decoupled:
            del self.pending[key]
            record.done.set_result(self.outputs(wire, record.wanted))
            return
        stream = record.core.stream
        if stream is None:  # a sequence batcher's filler row: its responses go nowhere (Triton's null request)
            if final:
                del self.pending[key]
                record.done.set_result(None)
            return
        if wire is None:
            stream.send(None, final=True)
        else:
            result = self.outputs(wire, record.wanted)
            if isinstance(result, ServerError):
                stream.send(None, error=result, final=final)
            else:
                stream.send(result, final=final, parameters=wire.get("p") or None)
        if final:
            del self.pending[key]
            record.done.set_result(None)

    # ---- health ----------------------------------------------------------------------------------
    def _health_check(self) -> None:
        if self.lost is not None:
            return
        self._ping += 1
        sent_at = time.monotonic()
        self.send({"op": "ping", "n": self._ping})
        self._health = self.loop.call_later(self.launch.timeout, self._health_missed, self._ping, sent_at)

    def _on_pong(self, n: Any) -> None:
        if n != self._ping or self._health is None or self.lost is not None:
            return
        self._health.cancel()
        self._health = self.loop.call_later(self.launch.health_interval, self._health_check)

    def _health_missed(self, n: int, sent_at: float) -> None:
        if n != self._ping or self.lost is not None:
            return
        waited = time.monotonic() - sent_at
        self.kill()
        self._lose(f"did not answer its health check within {waited:.0f} s and was killed")

    # ---- calls -------------------------------------------------------------------------------------
    def _reply(self, call_id: Any, value: Any = None, error: list[Any] | None = None) -> None:
        if error is not None:
            self.send({"op": "reply", "c": call_id, "x": error})
        else:
            self.send({"op": "reply", "c": call_id, "v": value})

    def _on_call(self, message: dict[str, Any]) -> None:
        call_id, name, args = message["c"], message["n"], message.get("a") or {}
        try:
            if name == "cancelled":
                record = self.pending.get(args["k"])
                self._reply(call_id, bool(record is not None and record.core.cancelled))
            elif name == "ready":
                registry = self.registry
                ready = registry is not None and registry.is_model_ready(str(args["name"]), str(args["version"]))
                self._reply(call_id, bool(ready))
            elif name == "control":
                self._track(self._control(call_id, args))
            elif name == "family":
                family = self.metrics.family(
                    str(args["name"]), str(args["description"]), _KINDS[int(args["kind"])], self.metrics_owner
                )
                handle = next(self._ids)
                self._families[handle] = family
                self._reply(call_id, handle)
            elif name == "metric":
                family = self._families[args["family"]]
                metric = self.metrics.metric(family, args.get("labels"), args.get("buckets"))
                handle = next(self._ids)
                self._metrics[handle] = (family, metric)
                self._reply(call_id, handle)
            elif name == "metric_op":
                family, metric = self._metrics[args["metric"]]
                op = str(args["op"])
                if op == "value":
                    self._reply(call_id, self.metrics.value(family, metric))
                elif op in ("increment", "set", "observe"):
                    getattr(self.metrics, op)(family, metric, float(args["value"]))
                    self._reply(call_id, None)
                else:
                    raise ValueError(f"unknown metric operation {op!r}")
            else:
                raise ValueError(f"unknown call {name!r}")
        except store.MetricError as exc:
            self._reply(call_id, error=["metric", str(exc), exc.core])

    def _track(self, coroutine: Any) -> None:
        task = self.loop.create_task(coroutine)
        self._bls[-id(task)] = task
        task.add_done_callback(lambda t: self._bls.pop(-id(t), None))

    async def _control(self, call_id: Any, args: dict[str, Any]) -> None:
        control = self.registry.model_control if self.registry is not None else None
        action = str(args["action"])
        if control is None:
            text = f"{action}_model() is only available inside a model served by kubeinfer"
            self._reply(call_id, error=["error", text, False])
            return
        try:
            if action == "load":
                await control.load_with_parameters(str(args["name"]), dict(args.get("parameters") or {}))
            else:
                await control.unload_model(str(args["name"]), bool(args.get("dependents")), wait=False)
        except ServerError as exc:
            self._reply(call_id, error=["control", exc.message, False])
            return
        self._reply(call_id, None)

    # ---- BLS ---------------------------------------------------------------------------------------
    def _on_bls(self, message: dict[str, Any]) -> None:
        bls_id = message["b"]
        try:
            inputs = {str(desc[0]): self.segments.array(desc) for desc in message["in"]}
        except ipc.SegmentUnreadable as exc:
            text = f"Python model instance '{self.name}' sent a BLS input the server cannot read: {exc}"
            self.send({"op": "bls_item", "b": bls_id, "r": {"e": ["INTERNAL", text]}, "end": True})
            return
        task = self.loop.create_task(self._run_bls(bls_id, dict(message["f"]), inputs, bool(message["d"])))
        self._bls[bls_id] = task
        task.add_done_callback(lambda _: self._bls.pop(bls_id, None))

    async def _run_bls(self, bls_id: int, fields: dict[str, Any], inputs: dict[str, Any], decoupled: bool) -> None:
        try:
            stream, end = bridge.start_bls(self.registry, fields, inputs, decoupled)  # type: ignore[arg-type]
        except bridge.BlsRefused as exc:
            self.send({"op": "bls_item", "b": bls_id, "r": {"e": ["INTERNAL", str(exc)]}, "end": True})
            return
        del inputs  # the request holds them while it runs
        try:
            async for item in stream:
                outputs, parameters, error = bridge.item_parts(item, end)
                wire: dict[str, Any]
                if error is not None:
                    wire = {"e": list(error)}
                else:
                    try:
                        wire = {"o": ipc.write_tensors(self.arena, outputs.items()), "p": parameters}
                    except ipc.ShmError as exc:
                        wire = {"e": ["INTERNAL", str(exc)]}
                self.send({"op": "bls_item", "b": bls_id, "r": wire, "end": item.final})
        except asyncio.CancelledError:
            stream.cancel()
            raise


def exit_description(status: int | None) -> str:
    """``exited with code 3`` / ``was killed by signal SIGSEGV (Segmentation fault)``."""
    if status is None:
        return "ended"
    if status < 0:
        try:
            sig = signal.Signals(-status)
            return f"was killed by signal {sig.name} ({signal.strsignal(sig) or sig.name})"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with code {status}"
