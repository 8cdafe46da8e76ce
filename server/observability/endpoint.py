"""The ``/metrics`` HTTP endpoint served on ``--metrics-port``."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .metrics import TritonMetrics


def build_metrics_app(metrics: TritonMetrics, model_registry: Any) -> Starlette:
    async def scrape(_: Request) -> Response:
        metrics.refresh(model_registry)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", scrape)])
