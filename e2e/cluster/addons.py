#!/usr/bin/env python3
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
* ``keda-http`` -- KEDA's HTTP add-on (operator, external scaler, interceptor) for scale to zero, built from
  the pinned Go module (``e2e/cluster/keda-http``); needs ``keda`` and the real worker node (see NOTES.md).
* ``kubeconform`` -- always built with the cluster (seconds): the binary plus JSON schemas
  generated offline from the pinned Kubernetes module's ``api/openapi-spec/swagger.json`` (the
  document the apiserver serves) and from the CRDs of KEDA and the Prometheus Operator.

Add-ons are opt-in: ``up --addons prometheus,keda,keda-http`` (or ``KUBEINFER_CLUSTER_ADDONS``) starts the
missing ones on a new or running cluster; ``down``/``release`` stop them with the cluster. Each is
cached like the control-plane binaries, under ``<cache>/addons/<name>-<hash of its inputs>``.

``python3 e2e/cluster/addons.py crd-schemas OUT CRD.yaml...`` writes kubeconform schemas for CRDs
(used by the tests for our own CRDs, which change with the code); ``kubeconform-dir`` prints (and
builds if needed) the kubeconform folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster.addons import kubeconform, schemas, support
from localcluster.base import ClusterError, log


def main(argv: list[str]) -> int:
    if argv == ["kubeconform-dir"]:
        try:
            print(kubeconform.kubeconform_dir())
        except ClusterError as e:
            log(f"ERROR: {e}")
            return 1
        return 0
    if len(argv) >= 2 and argv[0] == "crd-schemas":
        yaml = support.pyyaml()
        crds = [d for f in argv[2:] for d in yaml.safe_load_all(Path(f).read_text()) if d]
        print(schemas.write_crd_schemas(crds, Path(argv[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
