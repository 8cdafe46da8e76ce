"""Which transport serves the HTTP listener: the native one (native.py, the Rust extension's HTTP/1.1 server) or
uvicorn (``asgi``: today's path, uvicorn with the direct infer path where httptools loads).

``--http-transport`` (default from ``KUBEINFER_HTTP_TRANSPORT``, else ``auto``), as ``--grpc-transport``:

* ``native``: the native transport, or the server refuses to start saying why (module not built, or a setting
  it does not serve yet: TLS);
* ``asgi``: uvicorn;
* ``auto``: uvicorn while the native transport is new (issue 39, phase 1: opt-in), logged once.
"""

from __future__ import annotations

import importlib
import logging
import os

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "native", "asgi")
ENV = "KUBEINFER_HTTP_TRANSPORT"
DEFAULT = "auto"


def default_transport() -> str:
    """``KUBEINFER_HTTP_TRANSPORT`` if set (checked), else the built-in default."""
    value = os.environ.get(ENV, "").strip() or DEFAULT
    if value not in TRANSPORTS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(TRANSPORTS)}")
    return value


def native_missing() -> str | None:
    """Why the native transport's module cannot be imported (None: it can)."""
    try:
        module = importlib.import_module("..grpc.kubeinfer_grpc_transport", __package__)
    except ImportError as exc:
        return f"this installation has no Rust transport module (built without cargo, or not on Linux): {exc}"
    if not hasattr(module, "HttpTransport"):
        return "this installation's Rust transport module predates the HTTP transport: reinstall kubeinfer"
    return None


def choose(requested: str, tls: bool) -> str:
    """``native`` or ``asgi`` for ``requested`` (one of TRANSPORTS) and this configuration."""
    if requested == "asgi":
        log.debug("HTTP served by uvicorn (--http-transport asgi)")
        return "asgi"
    if requested == "auto":
        log.info("HTTP served by uvicorn (--http-transport auto; the native transport is opt-in: native)")
        return "asgi"
    reason = native_missing() or ("TLS (--http-tls-cert) is served by uvicorn only" if tls else None)
    if reason is not None:
        raise SystemExit(f"--http-transport native: the native HTTP transport cannot serve this server: {reason}")
    log.debug("HTTP served by the native transport (--http-transport native)")
    return "native"
