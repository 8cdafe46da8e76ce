"""Add-ons of the local cluster: the metrics path for autoscaling, and offline manifest validation.

* ``prometheus`` -- Prometheus 2.55.1 built from its pinned Go module (``e2e/cluster/prometheus``;
  Debian's package lacks Kubernetes service discovery). It scrapes every pod annotated
  ``prometheus.io/scrape: "true"`` through ``kubernetes_sd_configs`` (pod role), the annotations the
  operator puts on server pods, every ``KUBEINFER_PROMETHEUS_SCRAPE_INTERVAL`` (default 2s).
* ``keda`` -- KEDA's operator and metrics adapter, built from the pinned Go module
  (``e2e/cluster/keda``), with its CRDs and RBAC from the module's ``config/`` folder. Both run as
  host processes under KEDA's own service account (a token, not the admin identity); the adapter
  is an aggregated API (``v1beta1.external.metrics.k8s.io``) reached by the apiserver through an
  ExternalName Service that points at 127.0.0.1 (see NOTES.md).
* ``keda-http`` -- KEDA's HTTP add-on (operator, external scaler, interceptor), built from the pinned Go
  module (``e2e/cluster/keda-http``), with its CRDs and RBAC from the module's ``config/`` folder; it needs
  ``keda`` (started with it) and the real worker node. All three run as host processes under the add-on's
  own service accounts. The interceptor resolves its routes' Services as ``<service>.<namespace>`` through
  the node's CoreDNS (a private mount namespace with its own resolv.conf) and reaches their ClusterIPs
  through the host's route into the node; the scaler finds the interceptor's admin port through an
  EndpointSlice on the host's address; KEDA reaches the scaler at ``127.0.0.1`` (``up --json`` →
  ``addons["keda-http-scaler"]["address"]``, the proxy at ``addons["keda-http-interceptor"]["url"]``).
* ``kubeconform`` -- always built with the cluster (seconds): the binary plus JSON schemas
  generated offline from the pinned Kubernetes module's ``api/openapi-spec/swagger.json`` (the
  document the apiserver serves) and from the CRDs of KEDA and the Prometheus Operator.
* ``registry`` -- build-only (``build --addons registry``; ``up`` starts nothing): CNCF distribution's ``registry``
  and the ORAS CLI from their pinned Go modules (``e2e/cluster/registry``, ``registry/oras``); the tests start their
  own registries (``tests/support/oci_registry.py``).
* ``seaweedfs`` -- build-only: SeaweedFS's ``weed`` from its pinned Go module (``e2e/cluster/seaweedfs``), the tests'
  S3-compatible object store (``tests/support/s3_store.py`` starts ``weed mini``: master, volume server, filer and
  S3 gateway in one process, on free ports, with its own data folder and identities).
* ``fake-gcs`` -- build-only: fake-gcs-server, Google Cloud Storage's emulator, from its pinned Go module
  (``e2e/cluster/fake-gcs``), the tests' ``gs://`` store (``tests/support/gcs_store.py``).
* ``otelcol`` -- build-only: a trimmed OpenTelemetry Collector (OTLP receiver, batch processor, file exporter) from its
  pinned Go modules (``e2e/cluster/otelcol``), the receiver of the server's OpenTelemetry traces in the tests
  (``tests/support/otel_collector.py``).

Add-ons are opt-in: ``up --addons prometheus,keda,keda-http`` (or ``KUBEINFER_CLUSTER_ADDONS``) starts the
missing ones on a new or running cluster; ``down``/``release`` stop them with the cluster. Each is
cached like the control-plane binaries, under ``<cache>/addons/<name>-<hash of its inputs>``.

Modules: ``prometheus``, ``keda``, ``keda_http``, ``seaweedfs``, ``kubeconform`` (+ ``schemas``, its JSON schema
generation), ``support`` (what they share). ``e2e/cluster/addons.py`` is the command line of the schema tools.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from .. import processes
from ..addons import fake_gcs, keda, keda_http, kubeconform, otelcol, prometheus, seaweedfs
from ..addons import registry as oci_registry
from ..base import ClusterError
from ..processes import alive
from ..state import save_state

ADDONS = ("prometheus", "keda", "keda-http")
#: add-ons another one needs running (started first)
NEEDS = {"keda-http": ("keda",)}
#: add-ons ``build`` builds and ``up`` accepts but does not start (the tests run them)
BUILD_ONLY = ("registry", "seaweedfs", "fake-gcs", "otelcol")


def selected(arg: str | None) -> list[str]:
    """Add-on names from ``--addons`` (else ``KUBEINFER_CLUSTER_ADDONS``), checked."""
    raw = arg if arg is not None else os.environ.get("KUBEINFER_CLUSTER_ADDONS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in ADDONS + BUILD_ONLY]
    if unknown:
        raise ClusterError(f"unknown add-on(s) {unknown}; known: {', '.join(ADDONS + BUILD_ONLY)}")
    names += [dep for n in names for dep in NEEDS.get(n, ())]
    return [n for n in ADDONS + BUILD_ONLY if n in names]


def stop(rd: Path, state: dict) -> list[str]:
    """Stop every add-on process recorded in the state (``down``/``release`` call this first)."""
    stopped = []
    for name, comp in reversed(list((state.get("addons") or {}).items())):
        if processes.stop(comp, name):
            stopped.append(f"{name}({comp['pid']})")
        with contextlib.suppress(OSError):
            (rd / "pids" / f"{name}.pid").unlink()
    state["addons"] = {}
    shutil.rmtree(rd / "addons", ignore_errors=True)
    return stopped


def start(rd: Path, state: dict, names: list[str], timeout: float) -> float:
    """Start the named add-ons that are not running yet; returns the seconds it took."""
    t0 = time.monotonic()
    running = state.setdefault("addons", {})
    if "prometheus" in names and not (running.get("prometheus") and alive(running["prometheus"])):
        prometheus.start_prometheus(rd, state, prometheus.prometheus_dir(), timeout)
    if "keda" in names and not all(running.get(n) and alive(running[n]) for n in ("keda-operator", "keda-adapter")):
        for n in ("keda-adapter", "keda-operator"):
            if running.get(n):
                processes.stop(running.pop(n), n)
        keda.start_keda(rd, state, keda.keda_dir(), timeout)
    parts = keda_http.PROCESSES
    if "keda-http" in names and not all(running.get(n) and alive(running[n]) for n in parts):
        for n in reversed(parts):
            if running.get(n):
                processes.stop(running.pop(n), n)
        keda_http.start_keda_http(rd, state, keda_http.keda_http_dir(), timeout)
    save_state(rd, state)
    return time.monotonic() - t0


def ensure_built(names: list[str]) -> dict[str, str]:
    """Build/fetch kubeconform (always: the chart tests need it) and the named add-ons."""
    out = {"kubeconform": str(kubeconform.kubeconform_dir())}
    if "prometheus" in names:
        out["prometheus"] = str(prometheus.prometheus_dir())
    if "keda" in names:
        out["keda"] = str(keda.keda_dir())
    if "keda-http" in names:
        out["keda-http"] = str(keda_http.keda_http_dir())
    if "registry" in names:
        out["registry"] = str(oci_registry.registry_dir())
    if "seaweedfs" in names:
        out["seaweedfs"] = str(seaweedfs.seaweedfs_dir())
    if "fake-gcs" in names:
        out["fake-gcs"] = str(fake_gcs.fake_gcs_dir())
    if "otelcol" in names:
        out["otelcol"] = str(otelcol.otelcol_dir())
    return out


def describe(state: dict) -> dict:
    out = {}
    for name, comp in (state.get("addons") or {}).items():
        if alive(comp):
            out[name] = {k: comp[k] for k in ("pid", "log", "url", "address", "version") if k in comp}
    return out
