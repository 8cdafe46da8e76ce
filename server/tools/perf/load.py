"""The load itself: closed loop (``concurrency`` requests in flight) or open loop (a request rate).

A :class:`Worker` runs on one event loop in one process and keeps the latency of every completed
request until the coordinator takes a :class:`Sample` (one per measurement window). Several worker
processes split the load when one core cannot keep up (``--processes``); :class:`WorkerPool` drives
them over pipes. Requests are pre-encoded bytes (``wire``); responses are checked for their status
only (HTTP status line, gRPC status, a stream response's ``error_message``), never decoded.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
#: open loop: a request sent this much after its scheduled time counts as delayed
LATE_S = 0.001


@dataclass(frozen=True)
class Level:
    """One load level: closed loop when ``concurrency`` > 0, else open loop at ``rate`` requests/s."""

    concurrency: int = 0
    rate: float = 0.0
    distribution: str = "constant"  # or "poisson"
    #: open loop: at most this many requests in flight (perf_analyzer's --max-threads)
    max_inflight: int = 16


@dataclass(frozen=True)
class Setup:
    protocol: str  # "http" | "grpc"
    host: str
    port: int
    requests: tuple[bytes, ...]  # one per input-data step; requests cycle through them
    streaming: bool = False
    metadata: tuple[tuple[str, str], ...] = ()
    seed: int = 0
    #: the worker's index: it starts in the steps at a different place than its siblings
    index: int = 0
    #: gRPC over TLS: (root certificates, client key, client certificate chain) as PEM bytes, each optional
    tls: tuple[bytes | None, bytes | None, bytes | None] | None = None


@dataclass
class Sample:
    """What one worker saw since the previous sample."""

    latencies: np.ndarray  # seconds, one per successful request completed in the window
    errors: int = 0
    messages: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    delayed: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0

    @staticmethod
    def merge(samples: list[Sample]) -> Sample:
        messages: Counter[str] = Counter()
        for s in samples:
            messages.update(s.messages)
        return Sample(
            latencies=np.concatenate([s.latencies for s in samples]) if samples else np.empty(0),
            errors=sum(s.errors for s in samples),
            messages=messages,
            sent=sum(s.sent for s in samples),
            delayed=sum(s.delayed for s in samples),
            cpu_s=sum(s.cpu_s for s in samples),
            # the workers' windows are cut within a few microseconds of each other
            wall_s=max((s.wall_s for s in samples), default=0.0),
        )


class HttpConnection:
    """One keep-alive HTTP/1.1 connection sending pre-encoded requests."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes) -> str | None:
        """None on a 200 answer, else what went wrong."""
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            self.writer.write(request)
            head = await self.reader.readuntil(b"\r\n\r\n")
            length, chunked, close = 0, False, False
            for line in head.split(b"\r\n")[1:]:
                key, _, value = line.partition(b":")
                key = key.strip().lower()
                if key == b"content-length":
                    length = int(value)
                elif key == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif key == b"connection" and value.strip().lower() == b"close":
                    close = True
            body = await self._chunked() if chunked else await self.reader.readexactly(length)
            if close:
                self.close()
            if head[9:12] == b"200":
                return None
            status = head.split(b"\r\n", 1)[0][9:].decode("latin-1")
            return f"HTTP {status}: {body[:300].decode(errors='replace')}"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            return f"connection: {type(exc).__name__}: {exc}"

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return b"".join(parts)
            parts.append(data[:-2])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Worker:
    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.rng = np.random.default_rng(setup.seed + setup.index)
        self._next_step = setup.index
        self._channel: Any = None
        self._unary: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._idle_http: list[HttpConnection] = []
        self._reset()

    def _reset(self) -> None:
        self._latencies: list[float] = []
        self._errors = 0
        self._messages: Counter[str] = Counter()
        self._sent = 0
        self._delayed = 0
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()

    async def open(self) -> None:
        if self.setup.protocol == "grpc":
            import grpc

            options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            target = f"{self.setup.host}:{self.setup.port}"
            if self.setup.tls is not None:
                credentials = grpc.ssl_channel_credentials(*self.setup.tls)
                self._channel = grpc.aio.secure_channel(target, credentials, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(target, options=options)
            self._unary = self._channel.unary_unary(INFER_METHOD)

    async def close(self) -> None:
        for conn in self._idle_http:
            conn.close()
        if self._channel is not None:
            await self._channel.close()

    def _request(self) -> bytes:
        requests = self.setup.requests
        request = requests[self._next_step % len(requests)]
        self._next_step += 1
        return request

    def _record(self, t0: float, error: str | None) -> None:
        if error is None:
            self._latencies.append(time.perf_counter() - t0)
        else:
            self._errors += 1
            if len(self._messages) < 20 or error in self._messages:
                self._messages[error] += 1

    # ---- closed loop -----------------------------------------------------------------------
    async def _closed_http(self) -> None:
        conn = HttpConnection(self.setup.host, self.setup.port)
        try:
            while not self._stopping:
                request = self._request()
                self._sent += 1
                t0 = time.perf_counter()
                error = await conn.send(request)
                self._record(t0, error)
                if error is not None and error.startswith("connection"):
                    await asyncio.sleep(0.01)  # a server that went away: do not spin
        finally:
            conn.close()

    async def _grpc_once(self, request: bytes) -> str | None:
        import grpc

        try:
            await self._unary(request, metadata=self.setup.metadata or None)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return None

    async def _closed_grpc(self) -> None:
        while not self._stopping:
            request = self._request()
            self._sent += 1
            t0 = time.perf_counter()
            error = await self._grpc_once(request)
            self._record(t0, error)
            if error is not None and error.startswith("UNAVAILABLE"):
                await asyncio.sleep(0.01)

    async def _closed_stream(self) -> None:
        import grpc

        from ...grpc import grpc_service_pb2 as pb

        call = self._channel.stream_stream(STREAM_METHOD)(metadata=self.setup.metadata or None)
        try:
            while not self._stopping:
                request = self._request()
                self._sent += 1
                t0 = time.perf_counter()
                try:
                    await call.write(request)
                    answer = await call.read()
                except grpc.aio.AioRpcError as exc:
                    self._record(t0, f"{exc.code().name}: {exc.details()}")
                    return
                if answer is grpc.aio.EOF:
                    self._record(t0, "stream: the server ended the stream")
                    return
                # proto3 writes fields in number order: a set error_message (field 1) comes first
                error = None
                if answer[:1] == b"\x0a":
                    error = pb.ModelStreamInferResponse.FromString(answer).error_message or None
                self._record(t0, error)
        finally:
            call.cancel()

    # ---- open loop -------------------------------------------------------------------------
    async def _one(self, request: bytes, slots: asyncio.Semaphore) -> None:
        t0 = time.perf_counter()
        try:
            if self.setup.protocol == "grpc":
                error = await self._grpc_once(request)
            else:
                conn = self._idle_http.pop() if self._idle_http else HttpConnection(self.setup.host, self.setup.port)
                error = await conn.send(request)
                self._idle_http.append(conn)
            self._record(t0, error)
        finally:
            slots.release()

    async def _open(self, level: Level) -> None:
        slots = asyncio.Semaphore(level.max_inflight)
        mean = 1.0 / level.rate
        next_at = time.perf_counter()
        while not self._stopping:
            next_at += self.rng.exponential(mean) if level.distribution == "poisson" else mean
            wait = next_at - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._stopping:
                break
            await slots.acquire()  # more than --max-threads in flight: this send is late
            if time.perf_counter() - next_at > LATE_S:
                self._delayed += 1
            self._sent += 1
            task = asyncio.get_running_loop().create_task(self._one(self._request(), slots))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    # ---- the coordinator's commands -------------------------------------------------------
    async def start(self, level: Level) -> None:
        self._stopping = False
        self._reset()
        if level.concurrency > 0:
            if self.setup.protocol == "http":
                loop_fn: Any = self._closed_http
            else:
                loop_fn = self._closed_stream if self.setup.streaming else self._closed_grpc
            self._tasks = [asyncio.get_running_loop().create_task(loop_fn()) for _ in range(level.concurrency)]
        elif level.rate > 0:
            self._tasks = [asyncio.get_running_loop().create_task(self._open(level))]
        else:
            self._tasks = []

    def sample(self) -> Sample:
        now_cpu, now = time.process_time(), time.perf_counter()
        sample = Sample(
            latencies=np.array(self._latencies, dtype=np.float64),
            errors=self._errors,
            messages=self._messages,
            sent=self._sent,
            delayed=self._delayed,
            cpu_s=now_cpu - self._cpu0,
            wall_s=now - self._wall0,
        )
        self._reset()
        self._cpu0, self._wall0 = now_cpu, now
        return sample

    async def stop(self) -> Sample:
        """Stop sending; every request in flight finishes (and is counted) first."""
        self._stopping = True
        await asyncio.gather(*self._tasks, *self._inflight, return_exceptions=True)
        self._tasks = []
        return self.sample()


# ---- worker processes --------------------------------------------------------------------------
def _worker_main(conn: Any, setup: Setup) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        pass
    asyncio.run(_serve(conn, setup))


async def _serve(conn: Any, setup: Setup) -> None:
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = ("exit", None)
            loop.call_soon_threadsafe(commands.put_nowait, message)
            if message[0] == "exit":
                return

    threading.Thread(target=read, daemon=True, name="perf-commands").start()
    worker = Worker(setup)
    await worker.open()
    try:
        while True:
            command, argument = await commands.get()
            if command == "exit":
                return
            try:
                if command == "start":
                    await worker.start(argument)
                    result: Any = None
                elif command == "sample":
                    result = worker.sample()
                elif command == "stop":
                    result = await worker.stop()
                else:
                    raise ValueError(f"unknown command {command!r}")
                conn.send(("ok", result))
            except Exception as exc:  # reported to the coordinator, which stops
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        await worker.stop()
        await worker.close()


class WorkerPool:
    """``len(setups)`` worker processes; each call goes to all of them at once and returns their answers."""

    def __init__(self, setups: list[Setup]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes = []
        self._processes = []
        for setup in setups:
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker_main, args=(theirs, setup), daemon=True, name="perf-worker")
            process.start()
            theirs.close()
            self._pipes.append(ours)
            self._processes.append(process)

    def __len__(self) -> int:
        return len(self._pipes)

    def call(self, command: str, arguments: list[Any] | None = None) -> list[Any]:
        self.send(command, arguments)
        return self.receive()

    def send(self, command: str, arguments: list[Any] | None = None) -> None:
        for i, pipe in enumerate(self._pipes):
            pipe.send((command, arguments[i] if arguments is not None else None))

    def receive(self) -> list[Any]:
        answers = []
        for pipe, process in zip(self._pipes, self._processes, strict=True):
            while not pipe.poll(1.0):
                if not process.is_alive():
                    raise RuntimeError(f"a load worker exited with code {process.exitcode}")
            status, value = pipe.recv()
            if status != "ok":
                raise RuntimeError(f"a load worker failed: {value}")
            answers.append(value)
        return answers

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(("exit", None))
            except OSError:
                pass
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
