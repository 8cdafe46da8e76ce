"""The chart's Grafana dashboard (helm/kubeinfer/dashboards/kubeinfer.json) as the e2e tests read it: its panels'
queries, and each as Grafana sends it to Prometheus (template variables and built-ins replaced). Shared by
test_dashboard.py (every panel while traffic flows) and test_scale_to_zero.py (the wakes panel after real wakes).

Imported by module name, as chart_release.py is: pytest puts e2e/ (no ``__init__.py``) on ``sys.path``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

DASHBOARD = Path(__file__).resolve().parents[1] / "helm" / "kubeinfer" / "dashboards" / "kubeinfer.json"
#: Grafana's built-in variables as a dashboard over the last 30 minutes would set them (scrapes every 2 s here)
BUILTINS = {"$__rate_interval": "1m", "$__range_s": "1800", "$__range": "30m", "$__interval": "15s"}
#: the stat panel that counts a pool's returns from zero pods (scale-to-zero wakes, and its first start)
WAKES = "Wakes from zero in the time range"


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def substitute(expr: str, variables: dict[str, str]) -> str:
    """A query as Grafana sends it: template variables (``$name`` / ``${name}``) and built-ins replaced."""
    for name, value in BUILTINS.items():
        expr = expr.replace(name, value)
    for name, value in variables.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"a variable the test does not set: {expr}"
    return expr


def panel_targets(dash: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel, rows' nested panels included."""
    out = []
    for panel in dash["panels"]:
        for p in [panel, *panel.get("panels", ())]:
            out += [(p["title"], t["refId"], t["expr"]) for t in p.get("targets", ())]
    return out


def panel_query(title: str, variables: dict[str, str]) -> str:
    """The one query of the panel called ``title``, as Grafana sends it with ``variables``."""
    (expr,) = [e for t, _, e in panel_targets(dashboard()) if t == title]
    return substitute(expr, variables)


def instant(prometheus: str, promql: str) -> dict[str, Any]:
    """The Prometheus HTTP API's answer to an instant query."""
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=30)
    return dict(answer.json())
