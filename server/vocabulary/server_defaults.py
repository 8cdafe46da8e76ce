"""Defaults of kubeinfer-server's flags that other parts also state: the CLI and ``ServerSettings`` use them,
and so do the operator's pod manifests and the InferenceServer CRD's descriptions and CEL rule (generated from
here) and ``kubeinfer perf``. One home, so a change reaches every place."""

from __future__ import annotations

#: Triton's default listener ports (--http-port, --grpc-port, --metrics-port)
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
DEFAULT_PORTS = {"http": HTTP_PORT, "grpc": GRPC_PORT, "metrics": METRICS_PORT}
#: --shutdown-timeout (Triton's --exit-timeout-secs): seconds in-flight requests get after SIGTERM
SHUTDOWN_TIMEOUT_SECONDS = 30
