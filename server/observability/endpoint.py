"""The ``/metrics`` HTTP endpoint served on ``--metrics-port``."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .metrics import ServingModels, TritonMetrics, render

#: the classic Prometheus text format (what Triton serves; every Prometheus version scrapes it)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_metrics_app(metrics: TritonMetrics, model_registry: ServingModels) -> Starlette:
    async def scrape(_: Request) -> Response:
        metrics.refresh(model_registry)
        return Response(render(metrics.registry), media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", scrape)])
