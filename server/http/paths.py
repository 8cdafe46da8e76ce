"""Which way the HTTP front end answered inference requests: a counter a test (or an operator) can read.

The direct path (``fast_infer``) answers plain requests inside uvicorn's protocol; everything else (chunked
or compressed bodies, authentication failures, HTTP/1.0, a draining server, uvicorn's h11 protocol when
httptools is missing) goes through the ASGI route (``infer_route``). Exported on the metrics port as
``kubeinfer_http_infer_requests_total{path="direct"|"asgi"}``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class InferPaths(Collector):
    """Inference requests answered by each path since start (plain integer counts: one event loop)."""

    def __init__(self) -> None:
        self.direct = 0
        self.asgi = 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "kubeinfer_http_infer_requests",
            "HTTP inference requests by the path that answered them (direct: inside the HTTP protocol; asgi: the "
            "ASGI route)",
            labels=["path"],
        )
        family.add_metric(["direct"], self.direct)
        family.add_metric(["asgi"], self.asgi)
        yield family
