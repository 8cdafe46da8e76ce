"""The liveness endpoint of a replica that waits for the lease.

kopf serves ``--liveness`` only while it runs, and only the leader runs kopf. A follower answers the
same URL itself, so the chart's probe passes on every replica and a waiting follower is never
restarted; it reports failure only when its election loop has stopped making attempts. The port is
handed over to kopf when the follower becomes the leader.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, path) of a kopf-style liveness URL such as ``http://0.0.0.0:8080/healthz``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.port is None:
        raise ValueError(f"liveness URL '{url}' must look like http://HOST:PORT/PATH")
    return parts.hostname or "0.0.0.0", parts.port, parts.path or "/"


class FollowerLiveness:
    def __init__(self, url: str, healthy: Callable[[], bool]) -> None:
        host, port, path = parse_url(url)
        probe_path, is_healthy = path, healthy

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != probe_path:
                    self.send_error(404)
                    return
                ok = is_healthy()
                body = b'{"role": "follower"}\n' if ok else b'{"role": "follower", "error": "election loop stalled"}\n'
                self.send_response(200 if ok else 500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="follower-liveness")

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close the port (kopf opens it next)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
