"""Start a real ``kubeinfer-server`` process on free 127.0.0.1 ports; stop it by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from tests.support import processes
from tests.support.waiting import wait_for


def free_port() -> int:
    """A port free on 127.0.0.1 now, by the local cluster script's rule (below the kernel's ephemeral
    range, so an outgoing connection cannot take it before the server binds it; never twice)."""
    return _cluster_processes().free_ports(1)[0]


def _cluster_processes() -> ModuleType:
    from e2e.cluster.localcluster import processes  # stdlib only

    return processes


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    args: list[str] = field(default_factory=list)
    #: the address it listens on (tests that need a non-loopback one pass it to start_server)
    host: str = "127.0.0.1"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait; returns the exit code (-9 when it had to be killed after ``timeout``)."""
        code = processes.stop(self.proc, timeout)
        return -signal.SIGKILL if code is processes.KILLED else code

    def ready(self) -> bool:
        """``/v2/health/ready`` answers 200; raises if the process has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"kubeinfer-server exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return httpx.get(f"{self.base_url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 120) -> None:
        wait_for("kubeinfer-server ready", self.ready, timeout, describe=lambda: self.log()[-8000:])


def start_command(
    command: list[str],
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log_path: Path,
    wait: bool = True,
    env: dict[str, str] | None = None,
    wrapper: list[str] | None = None,
) -> ServerProcess:
    """``wrapper`` is a command the server runs under (e.g. ``setpriv`` dropping capabilities)."""
    """Start ``command`` (any command line that serves on these ports) and wait for readiness."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = ServerProcess(proc, http_port, grpc_port, metrics_port, log_path, command)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.terminate(10)
            raise
    return server


def start_server(
    repository: Path,
    *extra: str,
    log_dir: Path | None = None,
    wait: bool = True,
    env: dict[str, str] | None = None,
    wrapper: list[str] | None = None,
    host: str = "127.0.0.1",
) -> ServerProcess:
    """``wrapper`` is a command the server runs under (e.g. ``setpriv`` dropping capabilities)."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_dir = log_dir or repository.parent
    log_path = log_dir / f"server-{http_port}.log"
    args = [
        *(wrapper or []),
        sys.executable,
        "-m",
        "kubeinfer.server",
        "--model-repository",
        str(repository),
        "--host",
        host,
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        *extra,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = ServerProcess(proc, http_port, grpc_port, metrics_port, log_path, args, host=host)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.terminate(10)
            raise
    return server


def grpc_transports() -> list[Any]:
    """``--grpc-transport`` values to run a gRPC test module against: grpcio always, rust when its module is
    built (``pip install`` builds it with cargo; CI requires it), else skipped saying so."""
    import pytest
    from kubeinfer.server.grpc.transport import rust_missing

    missing = rust_missing()
    rust = pytest.param("rust", marks=pytest.mark.skipif(missing is not None, reason=f"Rust transport: {missing}"))
    return [pytest.param("grpcio"), rust]


def http_transports() -> list[Any]:
    """``--http-transport`` values to run an HTTP test module against: asgi (uvicorn) always, native when the
    Rust module has it (issue 39), else skipped saying so."""
    import pytest
    from kubeinfer.server.http.transport import native_missing

    missing = native_missing()
    native = pytest.param(
        "native", marks=pytest.mark.skipif(missing is not None, reason=f"native HTTP transport: {missing}")
    )
    return [pytest.param("asgi"), native]
