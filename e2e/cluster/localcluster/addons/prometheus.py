"""Prometheus 2.x built from its pinned module, scraping annotated pods (``kubernetes_sd_configs``, pod role)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from localcluster import apiclient, gotool, processes
from localcluster.addons import support
from localcluster.base import log
from localcluster.state import save_state

PROMETHEUS_RECIPE = "v1 trimpath cgo=0 tags=netgo,stringlabels ldflags=-s,-w,version-stamps"
#: promu's tags, less builtinassets (the web UI needs an npm build; the API is all the tests use)
PROMETHEUS_TAGS = "netgo,stringlabels"
SCRAPE_INTERVAL = os.environ.get("KUBEINFER_PROMETHEUS_SCRAPE_INTERVAL", "2s")


def prometheus_dir() -> Path:
    """Prometheus 2.x built from its pinned module (``e2e/cluster/prometheus``), version-stamped as promu does.

    Not Debian's ``prometheus`` package: Debian builds it without Kubernetes service discovery
    (``promtool check config`` of a ``kubernetes_sd_configs`` job: "field kubernetes_sd_configs not found
    in type config.ScrapeConfig"; its binary has no discovery/kubernetes package) -- see NOTES.md.
    """
    key = support.key(PROMETHEUS_RECIPE.encode(), *support.module_files("prometheus/go.mod", "prometheus/go.sum"))

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("prometheus", "github.com/prometheus/prometheus")
        version = (Path(info["dir"]) / "VERSION").read_text().strip()
        stamp = "github.com/prometheus/common/version"
        ldflags = [
            "-s -w",
            f"-X {stamp}.Version={version}",
            f"-X {stamp}.Revision={info['commit']}",
            f"-X {stamp}.Branch=HEAD",
            f"-X {stamp}.BuildUser=kubeinfer",
            f"-X {stamp}.BuildDate={info['time']}",
        ]
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-tags", PROMETHEUS_TAGS, "-ldflags", " ".join(ldflags),
             "-o", str(out / "prometheus"), "github.com/prometheus/prometheus/cmd/prometheus"],
            "prometheus",
        )  # fmt: skip
        (out / "VERSION").write_text(version + "\n")

    return support.cached("prometheus", key, make)


def prometheus_config(kubeconfig: str, interval: str = SCRAPE_INTERVAL) -> str:
    """The scrape config: the conventional ``kubernetes-pods`` job (pod annotations), as in Prometheus's
    own example configuration, so what works here works with an existing Prometheus set up the usual way."""
    cfg = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": kubeconfig}],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "action": "keep",
                     "regex": "true"},
                    {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "keep", "regex": "Running"},
                    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"], "action": "replace",
                     "target_label": "__metrics_path__", "regex": "(.+)"},
                    {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                     "action": "replace", "regex": "([^:]+)(?::\\d+)?;(\\d+)", "replacement": "$1:$2",
                     "target_label": "__address__"},
                    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                    {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace",
                     "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace", "target_label": "pod"},
                ],
            }
        ],
    }  # fmt: skip
    return json.dumps(cfg, indent=2) + "\n"  # JSON is YAML


def start_prometheus(rd: Path, state: dict, pdir: Path, timeout: float) -> None:
    home = rd / "addons" / "prometheus"
    shutil.rmtree(home, ignore_errors=True)
    (home / "data").mkdir(parents=True)
    (home / "prometheus.yml").write_text(prometheus_config(state["kubeconfig"]))
    (port,) = processes.free_ports(1)
    url = f"http://127.0.0.1:{port}"
    comp = support.launch(
        rd,
        state,
        "prometheus",
        [
            str(pdir / "prometheus"),
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            "--storage.tsdb.retention.time=6h",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.external-url={url}/",
        ],
    )
    comp["url"] = url
    comp["version"] = (pdir / "VERSION").read_text().strip()
    support.wait("Prometheus /-/ready", lambda: apiclient.http_ok(f"{url}/-/ready", insecure=False), [comp], timeout)
    save_state(rd, state)
    log(f"Prometheus {comp['version']} at {url} (scrape interval {SCRAPE_INTERVAL})")
