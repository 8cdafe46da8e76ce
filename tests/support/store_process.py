"""A real server process the tests start (an object store, an emulator): its command, a readiness probe, a log
file, ``stop()`` (a crash by default, or graceful) and ``start()`` again on the same ports with the same data.

The tests' stores derive from ``StoreProcess`` (tests/support/s3_store.py: SeaweedFS, gcs_store.py:
fake-gcs-server, azurite.py: Azurite): each gives its ``command()``, its ``ready()`` probe and its
``endpoint``; the process's life is here::

    class Store(StoreProcess):
        program = "store-server"
        log_name = "store.log"
        error = StoreError

        def __init__(self, root: Path, host: str = "127.0.0.1", *, start: bool = True) -> None:
            super().__init__(root, host, startup_timeout=30)
            self.port = free_port_on(host)
            if start:
                self.start()

The process runs in a session of its own (``start_new_session``), its output appended to ``root/log_name``
with a line per start; a readiness wait that sees it exit, or time out, raises ``error`` with the log's tail.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TypeVar

from tests.support.server import free_port

S = TypeVar("S", bound="StoreProcess")


class StoreProcessError(RuntimeError):
    """A store that did not start or serve (each store's own error derives from it)."""


def free_port_on(host: str) -> int:
    """A port by the suite's rule (``free_port``: below the ephemeral range, never twice) that is free on every
    address too, ``host`` included: a store bound to another host than 127.0.0.1 must not share a port number
    with one on loopback (``weed`` names its Unix sockets by port alone: /tmp/seaweedfs-s3-<port>.sock)."""
    while True:
        port = free_port()
        try:
            for addr in {"0.0.0.0", host}:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((addr, port))
        except OSError:
            continue
        return port


class StoreProcess:
    """One server process under ``root`` (its ``data/`` and its log), bound to ``host``.

    Subclasses give ``command()``, ``ready()`` and ``endpoint``; ``program`` names the process in messages,
    ``log_name`` its log file under ``root``, ``error`` the exception raised for it."""

    program: ClassVar[str] = "the store"
    log_name: ClassVar[str] = "store.log"
    error: ClassVar[type[StoreProcessError]] = StoreProcessError
    #: seconds between readiness probes while it starts
    ready_interval: ClassVar[float] = 0.25

    def __init__(self, root: Path, host: str, *, startup_timeout: float) -> None:
        self.root = Path(root)
        self.host = host
        self.startup_timeout = startup_timeout
        self.data_dir = self.root / "data"
        self.log_path = self.root / self.log_name
        self.proc: subprocess.Popen[bytes] | None = None
        self.data_dir.mkdir(parents=True, exist_ok=True)

    # -- what a store gives ----------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """True once it serves (one probe, a couple of seconds at most)."""
        raise NotImplementedError

    def _after_stop(self) -> None:
        """What a stopped process leaves behind that a new start must not find (nothing by default)."""

    # -- the process -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the process (again: same ports, same data) and wait until it serves."""
        if self.running():
            raise self.error(f"{self.program} at {self.endpoint} is running already")
        command = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} $ {' '.join(command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
            )
        try:
            self.wait_ready(self.startup_timeout)
        except BaseException:
            self.stop()
            raise

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, graceful: bool = False) -> None:
        """Kill the process (SIGKILL, as a crash; ``graceful``: SIGTERM first) and keep the data folder."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self._after_stop()

    def restart(self, graceful: bool = False) -> None:
        """``stop(graceful)``, then ``start()``: the same endpoint serves the same data again."""
        self.stop(graceful)
        self.start()

    def close(self) -> None:
        self.stop(graceful=True)

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- readiness -------------------------------------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise self.error(f"{self.program} exited ({code}) before it served:\n{self.log_tail()}")
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise self.error(
                    f"{self.program} did not serve at {self.endpoint} within {timeout:.0f}s "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(self.ready_interval)
