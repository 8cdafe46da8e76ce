"""The stub process: one Python model instance in its own interpreter, as Triton's
``triton_python_backend_stub`` runs it.

Started by the server (``stub_server``) with ``stub_boot.py``, which imports this package under a private
name without putting it on ``sys.path``; the model's ``import triton_python_backend_utils`` gets this
package's module. The process has three kinds of threads:

* the main thread runs the model: ``initialize``, then each ``execute`` the server sends, then
  ``finalize``;
* the reader thread answers the server's health checks, delivers BLS responses and call replies to
  the threads waiting for them, maps the server's shared-memory segments and frees blocks the server
  read; it ends the process when the server's end of the socket closes (the server died or unloaded
  the model);
* whatever threads the model starts (response senders from any thread).

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import queue
import select
import socket
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

from .. import ipc
from ..model_api import context
from ..model_api import triton_python_backend_utils as pb_utils
from ..model_api.pb_request import InferenceRequest, SenderState
from ..model_api.pb_types import InferenceResponse, Tensor, TritonError, TritonModelException
from . import dumpable
from .loader import ModelLoadError, ModelModule
from .runner import InitializeError, ModelRunner, exception_text

#: bytes of the first segment of the stub's arena, unless the server says (more are added as needed)
INITIAL_ARENA = 1 << 20
_STOP = object()


class Channel:
    """The stub's end of the socket: messages out from any thread, in on the reader thread."""

    def __init__(self, sock: socket.socket, arena_bytes: int = INITIAL_ARENA) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self._frees: list[list[int]] = []
        self.arena_lock = threading.Lock()
        self.arena = ipc.Arena(arena_bytes, self._announce, self._retire)
        self.segments = ipc.SegmentMap(self._release)

    def send(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        data = ipc.frame(message)
        with self.lock:
            frees, self._frees = self._frees, []
            if frees:
                data = ipc.frame({"op": "free", "b": frees}) + data
            try:
                if fds:
                    sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_ints(fds)))])
                    data = data[sent:]
                if data:
                    self.sock.sendall(data)
            except OSError:
                os._exit(0)  # the server is gone: nothing here is of use to anyone

    def has_frees(self) -> bool:
        return bool(self._frees)

    def flush_frees(self) -> None:
        if self._frees:
            with self.lock:
                frees, self._frees = self._frees, []
                if frees:
                    try:
                        self.sock.sendall(ipc.frame({"op": "free", "b": frees}))
                    except OSError:
                        os._exit(0)

    def _release(self, sid: int, offset: int) -> None:
        self._frees.append([sid, offset])  # list.append is atomic: safe from a finalizer on any thread

    def _announce(self, sid: int, fd: int, size: int) -> None:
        self.send({"op": "seg", "s": sid, "z": size}, (fd,))

    def _retire(self, sid: int) -> None:
        self.send({"op": "drop", "s": sid})

    def write(self, tensors: list[tuple[str, Any]]) -> list[list[Any]]:
        with self.arena_lock:
            return ipc.write_tensors(self.arena, tensors)

    def free(self, blocks: list[list[int]]) -> None:
        with self.arena_lock:
            for sid, offset in blocks:
                self.arena.free(sid, offset)


def _ints(values: tuple[int, ...]) -> bytes:
    import array

    return array.array("i", values).tobytes()


class StubHost:
    """``pb_utils`` calls sent to the server over the channel (``context.Host``)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._waiting: dict[int, list[Any]] = {}
        self._bls: dict[int, WireCall] = {}
        self._lock = threading.Lock()

    # ---- request/reply -------------------------------------------------------------------------
    def call(self, call: str, **args: Any) -> Any:
        call_id = next(self._ids)
        slot: list[Any] = [threading.Event(), None]
        with self._lock:
            self._waiting[call_id] = slot
        self.channel.send({"op": "call", "c": call_id, "n": call, "a": args})
        slot[0].wait()
        reply = slot[1]
        if "x" in reply:
            kind, message, core = reply["x"]
            if kind == "metric":
                raise context.MetricRefused(message, core)
            if kind == "control":
                raise context.ControlRefused(message)
            raise TritonModelException(message)
        return reply.get("v")

    def on_reply(self, message: dict[str, Any]) -> None:
        with self._lock:
            slot = self._waiting.pop(message["c"], None)
        if slot is not None:
            slot[1] = message
            slot[0].set()

    # ---- context.Host ------------------------------------------------------------------------------
    def bls(self, request: InferenceRequest, decoupled: bool) -> WireCall:
        bls_id = next(self._ids)
        call = WireCall(self)
        with self._lock:
            self._bls[bls_id] = call
        try:
            descs = self.channel.write([(t.name(), t.as_numpy()) for t in request.inputs()])
        except ipc.ShmError as exc:
            with self._lock:
                self._bls.pop(bls_id, None)
            call.put(InferenceResponse(error=TritonError(str(exc), TritonError.INTERNAL)))
            call.put(None)
            return call
        self.channel.send({"op": "bls", "b": bls_id, "f": request._bls_fields(), "in": descs, "d": decoupled})
        return call

    def on_bls_item(self, message: dict[str, Any]) -> None:
        with self._lock:
            call = self._bls.get(message["b"])
            if message.get("end"):
                self._bls.pop(message["b"], None)
        if call is None:
            return
        if "r" in message:
            call.put(response_from_wire(message["r"], self.channel.segments))
        if message.get("end"):
            call.put(None)

    def is_model_ready(self, name: str, version: str) -> bool:
        return bool(self.call("ready", name=name, version=version))

    def model_control(self, action: str, name: str, parameters: dict[str, Any], unload_dependents: bool) -> None:
        self.call("control", action=action, name=name, parameters=parameters, dependents=unload_dependents)

    def metric_family(self, name: str, description: str, kind: int, owner: str) -> int:
        return int(self.call("family", name=name, description=description, kind=kind))

    def release_family(self, family: int, owner: str) -> None:
        self.channel.send({"op": "unfamily", "h": family})

    def metric(self, family: int, labels: Any, buckets: Any) -> int:
        return int(self.call("metric", family=family, labels=labels, buckets=buckets))

    def release_metric(self, family: int, metric: int) -> None:
        self.channel.send({"op": "unmetric", "h": metric})

    def metric_op(self, op: str, family: int, metric: int, value: float | None) -> float | None:
        result = self.call("metric_op", op=op, metric=metric, value=value)
        return None if result is None else float(result)

    def log(self, level: int, message: str) -> None:
        self.channel.send({"op": "log", "l": int(level), "m": str(message)})


class WireCall:
    """One BLS request's responses as the reader thread receives them (``context.BlsCall``)."""

    def __init__(self, host: StubHost) -> None:
        self._cond = threading.Condition()
        self._items: deque[InferenceResponse | None] = deque()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._ended = False

    def put(self, item: InferenceResponse | None) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter
            loop.call_soon_threadsafe(_wake, future)

    def next(self) -> InferenceResponse | None:
        with self._cond:
            if self._ended:
                return None
            while not self._items:
                self._cond.wait()
            return self._pop()

    async def anext(self) -> InferenceResponse | None:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._ended:
                    return None
                if self._items:
                    return self._pop()
                future = loop.create_future()
                self._waiter = (loop, future)
            await future

    def _pop(self) -> InferenceResponse | None:
        item = self._items.popleft()
        if item is None:
            self._ended = True
        return item


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ---- responses on the wire ----------------------------------------------------------------------
def response_to_wire(channel: Channel, response: InferenceResponse, wanted: frozenset[str] | None) -> dict[str, Any]:
    """A model's response: its error, parameters and (requested) output tensors, written to shared memory."""
    wire: dict[str, Any] = {"p": response._parameters} if response._parameters else {}
    error = response.error()
    if error is not None:
        wire["e"] = [error.code().name, error.message()]
        return wire
    tensors = [(t.name(), t.as_numpy()) for t in response.output_tensors() if wanted is None or t.name() in wanted]
    try:
        wire["o"] = channel.write(tensors)
    except ipc.ShmError as exc:
        wire["e"] = ["INTERNAL", str(exc)]
    return wire


def response_from_wire(wire: dict[str, Any] | None, segments: ipc.SegmentMap) -> InferenceResponse:
    if wire is None:
        return InferenceResponse()
    if "e" in wire:
        code, message = wire["e"]
        return InferenceResponse(error=TritonError(message, getattr(TritonError, code, TritonError.INTERNAL)))
    tensors = [Tensor(desc[0], segments.array(desc)) for desc in wire.get("o", ())]
    return InferenceResponse(tensors, parameters=wire.get("p"))


class WireState(SenderState):
    """A request of the server's runtime: accepted responses go back over the channel."""

    def __init__(self, stub: Stub, key: int, decoupled: bool, wanted: frozenset[str] | None) -> None:
        super().__init__(decoupled)
        self.stub = stub
        self.key = key
        self.wanted = wanted

    def is_cancelled(self) -> bool:
        return bool(self.stub.host.call("cancelled", k=self.key))

    def _deliver(self, response: InferenceResponse | None, final: bool) -> None:
        wire = None if response is None else response_to_wire(self.stub.channel, response, self.wanted)
        self.stub.channel.send({"op": "deliver", "k": self.key, "r": wire, "f": final})

    def _finish(self, response: InferenceResponse) -> None:
        self._deliver(response, True)

    def _answer(self, response: InferenceResponse) -> dict[str, Any]:
        return response_to_wire(self.stub.channel, response, self.wanted)

    def _fail(self, message: str) -> None:
        self.stub.channel.send({"op": "fail", "k": self.key, "m": message})

    def _pending(self) -> None:
        return None


# ---- the process ------------------------------------------------------------------------------------
class Stub:
    def __init__(self, sock: socket.socket, arena_bytes: int = INITIAL_ARENA) -> None:
        self.channel = Channel(sock, arena_bytes)
        self.host = StubHost(self.channel)
        #: the main thread's messages (a C queue: its put and get cost a fraction of ``queue.Queue``'s)
        self.work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.runner: ModelRunner | None = None
        self._decoder = ipc.Decoder()
        self._fds: list[int] = []

    # ---- reader thread -----------------------------------------------------------------------
    def read_forever(self) -> None:
        sock = self.channel.sock
        try:
            while True:
                if self.channel.has_frees():  # blocks the model let go of: tell the server soon, even if idle
                    ready, _, _ = select.select([sock], [], [], 0.05)
                    if not ready:
                        self.channel.flush_frees()
                        continue
                data = ipc.recv(sock, self._fds)
                if not data:
                    break
                for message in self._decoder.feed(data):
                    self.dispatch(message)
        except Exception as exc:  # a broken channel: nobody can be answered any more
            print(f"kubeinfer stub: channel failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(0)  # the server closed its end (unload, or it died): the model goes with it

    def dispatch(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "ping":
            self.channel.send({"op": "pong", "n": message.get("n")})
        elif op == "reply":
            self.host.on_reply(message)
        elif op == "bls_item":
            self.host.on_bls_item(message)
        elif op == "free":
            self.channel.free(message["b"])
        elif op == "seg":
            self.channel.segments.add(message["s"], self._fds.pop(0), message["z"])
        elif op == "drop":
            self.channel.segments.drop(message["s"])
        else:  # init, exec, fin, autocomplete: the main thread's work, in order
            if "fr" in message:  # blocks the server read, sent along with an execute
                self.channel.free(message.pop("fr"))
            self.work.put(message)

    # ---- main thread -------------------------------------------------------------------------
    def run(self) -> None:
        threading.Thread(target=self.read_forever, name="stub-reader", daemon=True).start()
        while True:
            message = self.work.get()
            op = message["op"]
            if op == "exec":
                self.execute(message)
            elif op == "init":
                self.initialize(message)
            elif op == "autocomplete":
                self.auto_complete(message)
            elif op == "fin":
                if self.runner is not None:
                    self.runner.finalize()
                self.channel.send({"op": "finalized"})

    def initialize(self, message: dict[str, Any]) -> None:
        info = context.InstanceInfo(
            model_name=message["model_name"],
            model_version=message["model_version"],
            instance_name=message["instance_name"],
            version_dir=Path(message["version_dir"]),
            metrics_owner="",
        )
        context.set_process_instance(info)
        try:
            self.runner = ModelRunner(
                info, Path(message["model_file"]), message["label"], message["decoupled"], _code(message)
            )
            self.runner.initialize(message["args"])
        except ModelLoadError as exc:
            self.channel.send({"op": "init_failed", "m": str(exc)})
            return
        except InitializeError as exc:
            self.channel.send({"op": "init_failed", "m": f"{message['label']}: initialize failed: {exc}"})
            return
        self.channel.send({"op": "ready", "pid": os.getpid()})

    def execute(self, message: dict[str, Any]) -> None:
        assert self.runner is not None
        requests, states = self._requests(message["reqs"], self.runner.decoupled)
        results = self.runner.execute(requests, states)
        # the model's views of the inputs go now (unless it kept them), so that the blocks they read are
        # freed with the answer, not in a message of their own
        del requests
        self.channel.send({"op": "done", "id": message["id"], "res": results})

    def _requests(
        self, wire: list[dict[str, Any]], decoupled: bool
    ) -> tuple[list[InferenceRequest], list[SenderState]]:
        requests = []
        states: list[SenderState] = []
        for req in wire:
            wanted = frozenset(req["w"]) if req.get("w") is not None else None
            state = WireState(self, req["k"], decoupled, wanted)
            inputs = [Tensor(desc[0], self.channel.segments.array(desc)) for desc in req["in"]]
            requests.append(InferenceRequest._incoming(req["f"], inputs, state))
            states.append(state)
        return requests, states

    def auto_complete(self, message: dict[str, Any]) -> None:
        """Triton's auto-complete stub: the model's ``auto_complete_config`` on the config as JSON."""
        try:
            module = ModelModule(Path(message["model_file"]), message["label"], _code(message))
        except ModelLoadError as exc:
            self.channel.send({"op": "autocompleted", "error": str(exc)})
            return
        try:
            hook = getattr(module.model_class, "auto_complete_config", None)
            if hook is None:
                self.channel.send({"op": "autocompleted", "config": None})
                return
            helper = pb_utils.ModelConfig(message["config"])
            with module.active():
                try:
                    returned = hook(helper)
                except Exception as exc:
                    self.channel.send(
                        {
                            "op": "autocompleted",
                            "error": f"{message['label']}: auto_complete_config failed: {type(exc).__name__}: {exc}",
                        }
                    )
                    return
            if not isinstance(returned, pb_utils.ModelConfig):
                self.channel.send(
                    {
                        "op": "autocompleted",
                        "error": f"auto_complete_config function in model '{message['name']}' must return a valid "
                        "pb.ModelConfig object.",
                    }
                )
                return
            self.channel.send({"op": "autocompleted", "config": returned.as_dict()})
        finally:
            module.unload()


def main(argv: list[str]) -> None:
    """``stub_boot.py <socket fd> [<bytes of the first arena segment>]``."""
    # before any model code: another model's stub (same user) must not open this one's descriptors
    # (its tensors) or memory through /proc (``dumpable``); execve reset what the server had set
    dumpable.make_non_dumpable()
    sock = socket.socket(fileno=int(argv[0]))
    sock.setblocking(True)
    stub = Stub(sock, int(argv[1]) if len(argv) > 1 else INITIAL_ARENA)
    context.bind_host(stub.host)
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    try:
        stub.run()
    except BaseException as exc:  # a bug here: say why before the server sees the process go
        print(f"kubeinfer stub: {exception_text(exc)}", file=sys.stderr, flush=True)
        os._exit(1)


def _code(message: dict[str, Any]) -> bytes | None:
    """model.py as the server read it through the model folder's descriptor (base64 in the message)."""
    encoded = message.get("code")
    return base64.b64decode(encoded) if encoded is not None else None
