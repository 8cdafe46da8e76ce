"""A pod posing as a pool's replica (issue #37 item 1): what a tenant who may create pods in a pool's namespace
can start with the pool's labels. It answers every request with ``[`` + 150 MB of spaces + ``]`` (valid JSON: an
empty list, what once made the operator read it whole and be OOM-killed), without a Content-Length, and prints
each request it gets, so a test can read from its log whether anyone called it."""

from __future__ import annotations

from typing import Any

SCRIPT = """
import http.server
SIZE = 150 << 20
class Answer(http.server.BaseHTTPRequestHandler):
    def answer(self):
        print("request", self.command, self.path, self.client_address[0], flush=True)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = b" " * (1 << 20)
        try:
            self.wfile.write(b"[")
            for _ in range(SIZE // len(chunk)):
                self.wfile.write(chunk)
            self.wfile.write(b"]")
        except OSError:
            pass
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.ThreadingHTTPServer(("", 8000), Answer).serve_forever()
"""


def pod(name: str, labels: dict[str, str], image: str) -> dict[str, Any]:
    """The posing Pod (``image``: one with python3, e.g. this tree's server image), listening on port 8000 as a
    replica does."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "server",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", SCRIPT],
                    "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                }
            ],
        },
    }


def requests_seen(log: str) -> list[str]:
    """The requests the posing pod printed (its ``kubectl logs``)."""
    return [line for line in log.splitlines() if line.startswith("request")]
