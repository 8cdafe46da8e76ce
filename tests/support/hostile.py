"""Real HTTP file servers that misbehave on purpose: slow drip, endless, gzip bombs, redirects, garbage.

Each route is a function of the request handler that writes the whole answer itself; the server
records every request (path and headers), so a test can assert that a refused download sent nothing.
Used by the download tests, the e2e drill (e2e/test_operator_drill.py) and the tests of the operator's reads
from replicas (tests/unit/operator/test_replica_http.py).
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


@dataclass
class Request:
    path: str
    headers: dict[str, str]


@dataclass
class Seen:
    requests: list[Request] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return [r.path for r in self.requests]


class HostileServer:
    """A threaded HTTP server on ``host`` whose answer per path is a Route; records every request."""

    def __init__(self, routes: dict[str, Route] | None = None, host: str = "127.0.0.1") -> None:
        self.routes: dict[str, Route] = routes or {}
        self.seen = Seen()
        self.stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.seen.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}))
                route = outer.routes.get(self.path)
                if route is None:
                    send(self, 404, b"not found")
                    return
                try:
                    route(self)
                except (TimeoutError, BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))  # the request's body, unused
                self.do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = Server((host, 0), Handler)
        self.host = host
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    handler.send_response(status)
    for k, v in headers.items():
        handler.send_header(k.replace("_", "-"), v)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def file(data: bytes) -> Route:
    return lambda h: send(h, 200, data)


def redirect(location: str, status: int = 302) -> Route:
    return lambda h: send(h, status, b"", Location=location)


def error(status: int, body: bytes) -> Route:
    return lambda h: send(h, status, body)


def gzip_bomb(decoded_bytes: int) -> Route:
    """A small gzip body that decodes to ``decoded_bytes`` zeros, sent with Content-Encoding: gzip."""
    body = gzip.compress(b"\0" * decoded_bytes, 9)
    return lambda h: send(h, 200, body, Content_Encoding="gzip", Content_Type="application/octet-stream")


def declared(size: int) -> Route:
    """Headers that announce ``size`` bytes, then nothing."""

    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(size))
        h.end_headers()
        h.wfile.flush()
        time.sleep(2)

    return route


def drip(stop: threading.Event, interval: float, chunk: bytes = b"\0") -> Route:
    """A body without end, ``chunk`` every ``interval`` seconds (close-delimited), until ``stop``."""

    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        while not stop.is_set():
            h.wfile.write(chunk)
            h.wfile.flush()
            time.sleep(interval)

    return route


def endless(stop: threading.Event, chunk_bytes: int = 1 << 20) -> Route:
    """Zeros as fast as the client takes them, without a Content-Length."""
    return drip(stop, 0.0, b"\0" * chunk_bytes)


def garbage(data: bytes) -> Route:
    """Not HTTP at all: ``data`` and a closed connection."""

    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.wfile.write(data)
        h.wfile.flush()
        h.close_connection = True

    return route
