"""The gRPC listener on the Rust transport: queued calls → InferenceServicer → bytes back.

``Transport`` (rust/src/lib.rs, built by setup.py into ``kubeinfer_grpc_transport.abi3.so`` beside this file) is
tonic's gRPC server (HTTP/2, TLS, keepalive, framing, compression) on its own thread, and never takes the GIL; the
event loop watches its eventfd and drains every queued call at once. Each call runs the ``servicer.py`` handler
grpc.aio runs: the request parsed with the generated pb class (a malformed one is INVALID_ARGUMENT, as in
``errors.deserializer``), the response serialized, an exception mapped by ``errors.status_of`` — the same
statuses and messages as the grpc.aio server (server.py), which stays the fallback where this module is not built
(transport.py decides). Measured against grpc.aio and Triton in benchmarks/grpc_transport/.

With ``--auth-token-file`` the token is checked before a call's message is read: the transport hands over a call
whose ``authorization`` value Python has not admitted lately as a check (headers only), answered with
``admit`` (the message is then read and the call comes again) or ``refuse``; every call is checked again here
(``BearerToken.accepts`` is the one authority: a rotated or revoked token file takes effect at once, and a
refused value is forgotten by the transport). A call whose handling fails here fails alone, not its batch.

ModelStreamInfer runs ``servicer.ModelStreamInfer`` (streaming.StreamSession) over ``Requests``, which lets
the transport read one more request message each time the session asks for one: a session that stops
reading (``--grpc-max-stream-inflight``) holds the client back by HTTP/2 flow control, as with grpc.aio.
Responses are written as the session yields them, at most ``BACKLOG`` (rust/src/handoff.rs) waiting for a client
that reads slowly: then the task waits for room (``PendingCall.full``), so the session stops taking responses
and, its requests' slots not freed, stops reading requests (streaming.py). A client that cancels the stream
cancels the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from ..runtime.auth import PROBE_RPCS
from ..runtime.service import InferenceService
from . import grpc_service_pb2 as pb
from .errors import check_parsed, deserializer, status_of
from .kubeinfer_grpc_transport import PendingCall, Transport
from .server import SERVICE_NAME, BearerInterceptor
from .servicer import UNIMPLEMENTED, InferenceServicer, unimplemented
from .settings import GrpcSettings, Keepalive

log = logging.getLogger(__name__)

#: (parse bytes → request, handler(request, context) → awaitable response, serialize it)
Handler = tuple[Callable[[bytes], Any], Callable[[Any, Any], Any], Callable[[Any], bytes] | None]

#: grpc's answer to a method the server does not have (the transport's own when there is no token)
METHOD_NOT_FOUND = "Method not found!"

#: tokio worker threads: a second one bought nothing on 2 cores and cost CPU per request (README measurement)
THREADS = 1


def method_handlers(servicer: InferenceServicer) -> tuple[dict[str, Handler], dict[str, Handler]]:
    """Every RPC of our service descriptor by its full path (``/inference.GRPCInferenceService/X``): the
    unary ones, and the bidirectional streaming one (ModelStreamInfer; its parse applies to each message)."""
    unary: dict[str, Handler] = {}
    streams: dict[str, Handler] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_cls: Any = getattr(pb, method.input_type.name)
        table = streams if method.client_streaming or method.server_streaming else unary
        table[f"/{SERVICE_NAME}/{method.name}"] = (deserializer(request_cls), getattr(servicer, method.name), None)
    for name in UNIMPLEMENTED:
        unary[f"/{SERVICE_NAME}/{name}"] = (bytes, unimplemented(name), bytes)
    return unary, streams


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message


class StreamContext:
    """What streaming.StreamSession uses of grpc.aio's ServicerContext."""

    def __init__(self, call: PendingCall) -> None:
        self.call = call

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.call.metadata()

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise _Aborted(code, message)


class Requests:
    """A stream's request messages; each ``__anext__`` lets the transport read one more (flow control)."""

    def __init__(self, call: PendingCall, parse: Callable[[bytes], Any], loop: asyncio.AbstractEventLoop) -> None:
        self.call = call
        self.parse = parse
        self.loop = loop
        self.ready: deque[bytes | None] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.ended = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self.ended:
            raise StopAsyncIteration
        if not self.ready:
            self.waiter = self.loop.create_future()
            self.call.want()
            await self.waiter
        payload = self.ready.popleft()
        if payload is None:  # the client ended its side
            self.ended = True
            raise StopAsyncIteration
        return self.parse(payload)

    def deliver(self, payload: bytes | None) -> None:
        self.ready.append(payload)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class RustGrpcServer:
    """What app.serve uses of a grpc.aio server: ``await stop(grace)``."""

    def __init__(
        self,
        servicer: InferenceServicer,
        settings: GrpcSettings,
        loop: asyncio.AbstractEventLoop,
        threads: int = THREADS,
    ) -> None:
        unary, streams = method_handlers(servicer)
        paths = [*unary, *streams]  # the transport's method index
        self.handlers = [*unary.values(), *streams.values()]
        self.loop = loop
        self.token = settings.token
        #: the method indexes every caller may call (the probes), with --auth-token-file
        self.open = {i for i, path in enumerate(paths) if path.rsplit("/", 1)[-1] in PROBE_RPCS}
        #: with a token, calls to unknown methods come to _drain with this index: the token is checked first
        self.unknown = len(paths)
        tls = settings.tls
        keepalive = settings.keepalive
        self.transport = Transport(
            settings.host,
            settings.port,
            list(unary),
            list(streams),
            open=[path for i, path in enumerate(paths) if i in self.open],
            token=settings.token is not None,
            threads=threads,
            max_message_bytes=settings.limits.grpc_max_message_bytes,
            max_metadata_bytes=settings.limits.max_header_bytes,
            max_connection_age_ms=settings.max_connection_age_ms,
            max_connection_age_grace_ms=settings.max_connection_age_grace_ms,
            keepalive_time_ms=keepalive.time_ms,
            keepalive_timeout_ms=keepalive.timeout_ms,
            tls_cert=tls.cert.read_bytes() if tls else None,
            tls_key=tls.key.read_bytes() if tls else None,
            tls_client_ca=tls.client_ca.read_bytes() if tls and tls.client_ca else None,
        )
        self.port: int = self.transport.port
        #: call id → its task, so that a call its client gave up on is cancelled as grpc.aio does
        self.inflight: dict[int, asyncio.Task[None]] = {}
        #: call id → an open stream's request messages
        self.streams: dict[int, Requests] = {}
        #: call id → a stream waiting for room for its next response
        self.writable: dict[int, asyncio.Future[None]] = {}
        loop.add_reader(self.transport.fd, self._drain)

    def _drain(self) -> None:
        """All calls queued since the last wake-up start as tasks; calls their clients gave up are cancelled. One
        call's failure here answers that call (INTERNAL), never the others drained with it."""
        calls, cancelled, messages, writable, checks = self.transport.take()
        for check, index in checks:
            try:
                self._check(check, index)
            except Exception as exc:
                self._failed(check, exc)
        create_task = self.loop.create_task
        handlers = self.handlers
        inflight = self.inflight
        token = self.token
        for call, index, payload, call_id in calls:
            try:
                if token is not None and index not in self.open and not token.accepts(call.authorization()):
                    call.refuse(BearerInterceptor.MESSAGE)  # as grpc.aio's interceptor answers
                elif payload is None:  # a stream: its messages come one by one
                    requests = self.streams[call_id] = Requests(call, handlers[index][0], self.loop)
                    inflight[call_id] = create_task(self._stream(call, handlers[index], requests, call_id))
                else:
                    inflight[call_id] = create_task(self._run(call, handlers[index], payload, call_id))
            except Exception as exc:
                self._failed(call, exc)
        for call_id, message in messages:
            stream = self.streams.get(call_id)
            if stream is not None:
                stream.deliver(message)
        for call_id in writable:
            waiter = self.writable.pop(call_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        for call_id in cancelled:
            self.streams.pop(call_id, None)
            task = inflight.pop(call_id, None)  # popped here too: a task cancelled before it ran has no finally
            if task is not None:
                task.cancel()

    @staticmethod
    def _failed(call: PendingCall, exc: Exception) -> None:
        """One call that could not start: answered with its error's status (INTERNAL for an unexpected one)."""
        code, reason = status_of(exc)  # logs an unexpected one
        call.abort(code.value[0], reason)

    def _check(self, call: PendingCall, index: int) -> None:
        """A call the transport holds before reading its message: its token decides (as grpc.aio's interceptor,
        before the method lookup)."""
        if self.token is not None and not self.token.accepts(call.authorization()):
            call.refuse(BearerInterceptor.MESSAGE)
        elif index == self.unknown:
            call.abort(grpc.StatusCode.UNIMPLEMENTED.value[0], METHOD_NOT_FOUND)
        else:
            call.admit()

    async def _run(self, call: PendingCall, handler: Handler, payload: bytes, call_id: int) -> None:
        parse, fn, serialize = handler
        try:
            request = parse(payload)
            check_parsed(request)
            response = await fn(request, call)
            call.reply(response.SerializeToString() if serialize is None else serialize(response))
        except Exception as exc:  # mapped to a status, as errors.unary does for grpc.aio
            code, message = status_of(exc)
            call.abort(code.value[0], message)
        finally:
            self.inflight.pop(call_id, None)

    async def _stream(self, call: PendingCall, handler: Handler, requests: Requests, call_id: int) -> None:
        replies = handler[1](requests, StreamContext(call))
        try:
            async with contextlib.aclosing(replies):  # the session's cleanup runs before the task ends
                async for reply in replies:
                    if not call.send(reply.SerializeToString()):
                        return  # the stream has ended: its client left, or the reply was over the limit
                    if call.full():  # the client reads slowly: wait for room (cancelled if it leaves)
                        waiter = self.writable[call_id] = self.loop.create_future()
                        await waiter
            call.finish()
        except _Aborted as aborted:  # StreamSession closing the stream with a status (triton_grpc_error)
            call.abort(aborted.code.value[0], aborted.message)
        except Exception as exc:
            code, message = status_of(exc)
            call.abort(code.value[0], message)
        finally:
            self.inflight.pop(call_id, None)
            self.streams.pop(call_id, None)
            self.writable.pop(call_id, None)

    def stats(self) -> tuple[int, int]:
        """(calls, event-loop wake-ups) since start: how many calls one wake-up drained."""
        calls, wakeups = self.transport.stats()
        return int(calls), int(wakeups)

    async def stop(self, grace: float | None = None) -> None:
        self.transport.close()  # new calls UNAVAILABLE, GOAWAY to every connection
        if self.inflight:
            await asyncio.wait(set(self.inflight.values()), timeout=grace)
        for task in list(self.inflight.values()):  # past the grace: cancelled, as grpc.aio's stop does
            task.cancel()
        self.loop.remove_reader(self.transport.fd)
        calls, wakeups = self.stats()
        log.info("gRPC (Rust transport): %d calls in %d event-loop wake-ups", calls, wakeups)
        # the runtime's tasks write the answers already given, then it stops (connections closed)
        await asyncio.to_thread(self.transport.shutdown, 2.0)


def unsupported(settings: GrpcSettings) -> str | None:
    """What of this configuration the Rust transport cannot serve (None: all of it)."""
    keepalive, default = settings.keepalive, Keepalive()
    if (
        keepalive.max_pings_without_data,
        keepalive.min_recv_ping_interval_without_data_ms,
        keepalive.max_ping_strikes,
    ) != (
        default.max_pings_without_data,
        default.min_recv_ping_interval_without_data_ms,
        default.max_ping_strikes,
    ):
        return "a --grpc-http2-* ping policy other than Triton's default is enforced by grpc.aio only"
    return None


async def start_rust_grpc_server(service: InferenceService, settings: GrpcSettings) -> RustGrpcServer:
    """``start_grpc_server``'s contract, on the Rust transport, for settings ``unsupported`` accepts
    (transport.choose has asked it)."""
    try:
        servicer = InferenceServicer(service, settings.limits, settings.shm)
        server = RustGrpcServer(servicer, settings, asyncio.get_running_loop())
    except OSError as exc:  # "gRPC listener on <address> failed to start: <why>" (or a TLS file refused)
        raise SystemExit(str(exc)) from None
    log.info("gRPC listening on %s (Rust transport)", settings.address)
    return server
