"""Which way the HTTP front end answered inference requests: a counter a test (or an operator) can read.

The direct path (``fast_infer``) answers plain requests inside uvicorn's protocol; everything else (chunked
or compressed bodies, authentication failures, HTTP/1.0, a draining server, uvicorn's h11 protocol when
httptools is missing) goes through the ASGI route (``infer_route``). Exported on the metrics port as
``kubeinfer_http_infer_requests{path="direct"|"asgi"}`` (a counter without prometheus-client's ``_total``
suffix, as every family of this server: Triton's style).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class InferPaths(Collector):
    """Inference requests answered by each path since start (plain integer counts: one event loop)."""

    def __init__(self) -> None:
        self.direct = 0
        self.asgi = 0

    def collect(self) -> Iterator[Metric]:
        family = Metric(
            "kubeinfer_http_infer_requests",
            "HTTP inference requests by the path that answered them (direct: inside the HTTP protocol; asgi: the "
            "ASGI route)",
            "counter",
        )
        family.add_sample(family.name, {"path": "direct"}, self.direct)
        family.add_sample(family.name, {"path": "asgi"}, self.asgi)
        yield family
