"""The ``/metrics`` HTTP endpoint served on ``--metrics-port``, and the health checks beside it.

The metrics listener is always plain HTTP without authentication, so the health checks are answered
here too: with client certificates required on the HTTP port (mTLS) a kubelet, which has none, can only
probe this one. They say no more than the HTTP port's exempt health checks do.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .metrics import ServingModels, TritonMetrics, render

#: the classic Prometheus text format (what Triton serves; every Prometheus version scrapes it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_metrics_app(
    metrics: TritonMetrics,
    model_registry: ServingModels,
    live: Callable[[], bool] = lambda: True,
    ready: Callable[[], bool] = lambda: True,
) -> Starlette:
    async def scrape(_: Request) -> Response:
        metrics.refresh(model_registry)
        return Response(render(metrics.registry), media_type=CONTENT_TYPE)

    async def health_live(_: Request) -> Response:
        return Response(status_code=200 if live() else 503)

    async def health_ready(_: Request) -> Response:
        return Response(status_code=200 if ready() else 503)

    return Starlette(
        routes=[
            Route("/metrics", scrape),
            Route("/v2/health/live", health_live),
            Route("/v2/health/ready", health_ready),
        ]
    )
