"""A minimal Kubernetes API client (the admin certificate, stdlib only) and the health checks ``up`` polls."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path


class Api:
    def __init__(self, server: str, pki: Path):
        self.server = server
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as e:
            return 0, str(e)

    def get_json(self, path: str) -> dict | None:
        code, text = self.call("GET", path)
        return json.loads(text) if code == 200 else None


def http_ok(url: str, insecure: bool = True) -> bool:
    ctx = ssl._create_unverified_context() if insecure else None  # self-signed serving certs of KCM/scheduler
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=3) as r:
            return r.status == 200
    except (OSError, ssl.SSLError, urllib.error.URLError):
        return False


def node_ready(api: Api, name: str) -> bool:
    n = api.get_json(f"/api/v1/nodes/{name}")
    if not n:
        return False
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
    tainted = any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints", []))
    return ready and not tainted
