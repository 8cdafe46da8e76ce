"""Issue 38 item 8, what platform teams look at, on the real cluster: the chart's Grafana dashboard and the
``kubectl get im`` / ``isrv`` columns.

The dashboard (helm/kubeinfer/dashboards/kubeinfer.json) ships in a ConfigMap with the label Grafana's
dashboard sidecar loads (kube-prometheus-stack's ``grafana_dashboard: "1"``), as ``helm template`` renders it.
Every panel's query, its template variables set to a real pool, runs against the real Prometheus of the local
cluster (the usual ``kubernetes-pods`` job) while requests flow to that pool: a query that errors or returns no
series fails, naming its panel (the load failures panel too: its counter is at 0 before any failure); each
template variable's ``label_values`` finds the pool. The pool: one pod of this tree's server image with
``spec.modelCache`` whose budget holds one of its three models (so requests to them in turn load and evict), KEDA
as its autoscaler, and a fourth model whose file does not exist (the "why not").
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
import yaml
from dashboard_queries import WAKES, dashboard, instant, panel_query, panel_targets, substitute

from tests.support.host_operator import HostOperator, InNamespace, host_operator, matmul_model, pool_server
from tests.support.models import matmul
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeinfer"
API = "serving.kubeinfer.io/v1alpha1"
POOL = "dash-pool"
MODELS = ("d0", "d1", "d2")
BROKEN = "d-missing"
SIZE = 512  # 1 MiB of weight per model
BUDGET = "2Mi"  # one model at a time: requests to the three in turn load and evict
#: requests to each model in its turn, and the seconds a round of the three turns takes at least: 3 loads every
#: 5 s stay under the model cache's guard against thrashing (it refuses a load that would evict after 60 within
#: a minute)
REQUESTS_PER_TURN = 5
ROUND_SECONDS = 5.0
#: how kubectl prints a cell whose field is absent (blank for a custom resource's column; <none> elsewhere)
EMPTY = ("", "<none>")


def dashboard_configmaps(helm: Any, *args: str) -> list[dict[str, Any]]:
    """The ConfigMaps of ``helm template`` of the chart (``args``: more helm arguments) that carry the dashboard."""
    out = helm("template", "rel", str(CHART), "-n", "monitoring", *args).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return [d for d in docs if d["kind"] == "ConfigMap" and "kubeinfer.json" in (d.get("data") or {})]


def test_the_chart_ships_the_dashboard_with_the_sidecar_label(helm: Any) -> None:
    (cm,) = dashboard_configmaps(helm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["kubeinfer.json"]) == dashboard()
    (cm,) = dashboard_configmaps(
        helm,
        # a sidecar configured with another label: helm merges maps, null drops the default one
        "--set", "monitoring.grafanaDashboard.labels.grafana_dashboard=null",
        "--set", "monitoring.grafanaDashboard.labels.team_dashboards=yes",
        "--set", "monitoring.grafanaDashboard.namespace=grafana",
        "--set", "monitoring.grafanaDashboard.annotations.grafana_folder=Inference",
    )  # fmt: skip
    assert cm["metadata"]["labels"]["team_dashboards"] == "yes" and "grafana_dashboard" not in cm["metadata"]["labels"]
    assert (cm["metadata"]["namespace"], cm["metadata"]["annotations"]) == ("grafana", {"grafana_folder": "Inference"})
    assert dashboard_configmaps(helm, "--set", "monitoring.grafanaDashboard.enabled=false") == []


@dataclass
class Pool(InNamespace):
    op: HostOperator
    prometheus: str

    def describe(self) -> str:
        out = self.kubectl("get", "isrv,im,pods", "-o", "wide", check=False).stdout
        return out + "\n--- operator:\n" + self.op.log.read_text(errors="replace")[-5000:]

    def query(self, promql: str) -> dict[str, Any]:
        """The Prometheus HTTP API's answer to an instant query."""
        return instant(self.prometheus, promql)

    def table(self, kind: str) -> dict[str, dict[str, str]]:
        """``kubectl get <kind>`` as printed: row name → column header → cell (a cell starts where its header
        does: kubectl aligns the columns; an empty cell is "")."""
        text = self.kubectl("get", kind).stdout
        print(f"$ kubectl get {kind}\n{text}")  # what the columns look like, shown with -s
        header, *rows = text.splitlines()
        spans = [(m.start(), m[0]) for m in re.finditer(r"\S+(?: \S+)*", header)]
        ends = [start for start, _ in spans[1:]] + [None]
        table = [{name: row[start:end].strip() for (start, name), end in zip(spans, ends, strict=True)} for row in rows]
        return {row["NAME"]: row for row in table}


@pytest.fixture(scope="module")
def pool(
    cluster: Any, node: dict, images: dict, metrics_stack: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pool]:
    assert images["info"]["images"][0]["role"] == "server"
    with host_operator(
        cluster, node, "e2e-dash", tmp_path_factory.mktemp("dashboard"),
        extra_args=("--prometheus-url", metrics_stack.prometheus_url),
    ) as op:  # fmt: skip
        uploads = op.uploads()
        for i, name in enumerate(MODELS):
            onnx.save(matmul(SIZE, seed=i)[0], uploads / f"{name}.onnx")
        p = Pool(cluster, op.ns, op, metrics_stack.prometheus_url)
        autoscaling = {"autoscaler": "KEDA", "minReplicas": 1, "maxReplicas": 1,
                       "target": {"metric": "PendingRequests", "value": "1000"}}  # fmt: skip
        p.apply(
            pool_server(
                POOL,
                images,
                replicas=1,
                modelCache={"memoryBudget": BUDGET, "loadTimeoutSeconds": 60},
                autoscaling=autoscaling,
            )
        )
        models = [matmul_model(name, POOL, SIZE) for name in (*MODELS, BROKEN)]
        p.apply({"apiVersion": "v1", "kind": "List", "items": models})
        yield p


def _ready(model: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (model.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})


def _serving(pool: Pool) -> bool:
    items = {m["metadata"]["name"]: m for m in pool.get("inferencemodels").get("items") or ()}
    return all(_ready(items.get(name, {})).get("status") == "True" for name in MODELS)


class Traffic:
    """Requests to the pool's models in turn, through its Service, on a thread, until stopped: what the
    panels show. Every answer is checked; failures are kept."""

    def __init__(self, address: str) -> None:
        self.address, self.ok = address, 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = np.random.default_rng(0)
        weights = {name: matmul(SIZE, seed=i)[1] for i, name in enumerate(MODELS)}
        client = httpclient.InferenceServerClient(self.address, network_timeout=90)
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                for name, weight in weights.items():
                    for _ in range(REQUESTS_PER_TURN):
                        x = rng.standard_normal((1, SIZE), dtype=np.float32)
                        inp = httpclient.InferInput("IN", [1, SIZE], "FP32")
                        inp.set_data_from_numpy(x)
                        try:
                            out = client.infer(name, [inp]).as_numpy("OUT")
                        except Exception as exc:  # every failure is counted
                            self.failures.append(f"{name}: {str(exc)[:200]}")
                            continue
                        if np.allclose(out, x @ weight, rtol=1e-3, atol=1e-2):
                            self.ok += 1
                        else:
                            self.failures.append(f"{name}: wrong answer")
                self.stop.wait(max(0.0, ROUND_SECONDS - (time.monotonic() - began)))
        finally:
            client.close()

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)


def test_every_panel_query_returns_series_while_traffic_flows(pool: Pool) -> None:
    wait_for_cluster("the three models Ready", lambda: _serving(pool), 600, describe=pool.describe)
    dash = dashboard()
    targets = panel_targets(dash)
    titles = {p["title"] for p in dash["panels"] if p["type"] != "row"}
    assert titles <= {t for t, _, _ in targets}, "a panel without a query"
    variables = {"namespace": pool.ns, "server": POOL, "model": "|".join(MODELS)}
    ip = pool.get("service", POOL)["spec"]["clusterIP"]
    results: dict[tuple[str, str], str] = {}

    def all_answer() -> bool:
        for title, ref, expr in targets:
            answer = pool.query(substitute(expr, variables))
            if answer.get("status") != "success":
                results[(title, ref)] = f"error {answer.get('errorType')}: {answer.get('error')}"
            elif not answer["data"]["result"]:
                results[(title, ref)] = "no series"
            else:
                results[(title, ref)] = "ok"
        return all(r == "ok" for r in results.values())

    def report() -> str:
        bad = [f"panel {t!r} query {r}: {why}" for (t, r), why in results.items() if why != "ok"]
        return "\n".join(bad) + f"\n{traffic.ok} answers, failures: {traffic.failures[:5]}\n" + pool.describe()

    with Traffic(f"{ip}:8000") as traffic:
        # the rate() windows need two scrapes of every counter after the traffic began
        wait_for_cluster("every panel's query answering with series", all_answer, 240, 3, report)
    assert not traffic.failures, traffic.failures[:10]
    assert traffic.ok >= len(MODELS), traffic.ok
    evictions = pool.query(substitute(f'sum(kubeinfer_model_cache_evictions{{namespace="{pool.ns}"}})', {}))
    assert float(evictions["data"]["result"][0]["value"][1]) > 0, "the budget of one model evicted none"
    # the load failures panel has a line at 0 for each model before any load of it fails (not "no data")
    (expr,) = [e for title, _, e in targets if "kubeinfer_model_load_failures" in e]
    failures = pool.query(substitute(expr, variables))["data"]["result"]
    assert {r["metric"]["model"]: float(r["value"][1]) for r in failures} == dict.fromkeys(MODELS, 0.0), failures
    # the wakes panel: this pool (minReplicas 1) came from zero pods once, at its first start, and not since
    wakes = pool.query(panel_query(WAKES, variables))["data"]["result"]
    assert [float(r["value"][1]) for r in wakes] == [1.0], wakes
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["query"]["query"])
        assert m, var["query"]
        selector, label = substitute(m[1], variables), m[2]
        series = httpx.get(f"{pool.prometheus}/api/v1/series", params={"match[]": selector}, timeout=30).json()
        values = {s.get(label) for s in series["data"]}
        assert variables[var["name"]].split("|")[0] in values, (var["name"], selector, sorted(map(str, values)))


def test_kubectl_get_says_what_serves_and_why_not(pool: Pool) -> None:
    wait_for_cluster("the three models Ready", lambda: _serving(pool), 600, describe=pool.describe)
    im = pool.table("im")
    for name in MODELS:
        row = im[name]
        assert (row["READY"], row["VERSIONS"], row["REPLICAS"], row["SERVER"], row["REASON"]) == (
            "True", "1", "1/1", POOL, "Serving",
        ), im  # fmt: skip
    broken = pool.get("inferencemodel", BROKEN)
    row = im[BROKEN]
    assert row["READY"] == "False" and row["VERSIONS"] in EMPTY, im
    assert row["REASON"] == _ready(broken)["reason"] and row["REASON"] not in (*EMPTY, "Serving"), im

    def pool_row() -> dict[str, str] | None:
        row = pool.table("isrv")[POOL]
        return row if row["PROBLEM"] in EMPTY and row["AUTOSCALER"] not in EMPTY else None

    row = wait_for_cluster("the pool's row without a problem", pool_row, 180, describe=pool.describe)
    assert (row["READY"], row["DESIRED"], row["AVAILABLE"], row["AUTOSCALER"], row["MODELS"]) == (
        "1", "1", "True", "KEDA", str(len(MODELS) + 1),
    ), row  # fmt: skip
