"""A real Redis server for the redis response cache's tests: Debian's ``redis-server`` (e2e/cluster/system-packages,
which .ci/run calls, installs it), started on a free loopback port in a temporary directory with persistence off.

Without the binary a test is skipped with the reason, except in CI (``CI`` set), where it fails: CI installs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.server import free_port
from tests.support.waiting import wait_for


def redis_binary() -> str:
    """The path of ``redis-server``; skips the test (fails it in CI) when it is not installed."""
    path = shutil.which("redis-server")
    if path is None:
        reason = "redis-server is not installed (Debian: apt-get install redis-server; e2e/cluster/system-packages)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must install it")
        pytest.skip(reason)
    return path


@dataclass
class RedisServer:
    """One redis-server process; ``stop`` and ``start`` again on the same port (and password) for outages."""

    directory: Path
    port: int
    password: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / f"redis-{self.port}.log"

    def start(self) -> RedisServer:
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.directory), "--logfile", str(self.log_path), "--daemonize", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=self.directory)
        wait_for(f"redis-server on port {self.port}", self._listening, 30, describe=self._log)
        return self

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self._log()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            processes.stop(self.proc, 10)
            self.proc = None

    def command(self, *args: str) -> bytes:
        """One command over RESP (the tests need no client library for it): its raw reply."""
        parts = ([b"AUTH", self.password.encode()] if self.password else []), [a.encode() for a in args]
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            reply = b""
            for part in parts:
                if not part:
                    continue
                s.sendall(b"*%d\r\n" % len(part) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in part))
                reply = s.recv(65536)
            return reply


def start_redis(directory: Path, password: str | None = None) -> RedisServer:
    directory.mkdir(parents=True, exist_ok=True)
    return RedisServer(directory, free_port(), password).start()
