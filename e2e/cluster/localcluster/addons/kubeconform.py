"""kubeconform and the JSON schemas it validates against: the pinned Kubernetes version's kinds and the CRDs of
KEDA and the Prometheus Operator (ServiceMonitor/PodMonitor)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .. import gotool
from ..addons import support
from ..addons.keda import keda_crds_from_module
from ..addons.schemas import write_crd_schemas, write_k8s_schemas
from ..addons.support import run
from ..base import ClusterError, log

#: CRDs of the Prometheus Operator (ServiceMonitor/PodMonitor), for validating the chart's optional monitors.
#: Pinned with the module's go.sum hash (checked after download).
PROM_OPERATOR = (
    "github.com/prometheus-operator/prometheus-operator",
    "v0.85.0",
    "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=",
)
PROM_OPERATOR_CRDS = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_podmonitors.yaml")
# bump when the schema conversion below changes
KUBECONFORM_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w schemas=swagger-v2-strict+keda+monitoring"


def kubeconform_dir() -> Path:
    key = support.key(
        KUBECONFORM_RECIPE.encode(),
        *support.module_files("kubeconform/go.mod", "kubeconform/go.sum", "k8s/go.mod", "keda/go.mod"),
        PROM_OPERATOR[1].encode(),
    )

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-ldflags", "-s -w", "-o", str(out / "kubeconform"),
             "github.com/yannh/kubeconform/cmd/kubeconform"],
            "kubeconform",
        )  # fmt: skip
        k8s = gotool.module_info("k8s", "k8s.io/kubernetes")
        swagger = json.loads((Path(k8s["dir"]) / "api/openapi-spec/swagger.json").read_text())
        n = write_k8s_schemas(swagger, out / "schemas" / f"{k8s['version']}-standalone-strict")
        (out / "KUBERNETES_VERSION").write_text(k8s["version"].lstrip("v") + "\n")
        crds = keda_crds_from_module()
        crds += prometheus_operator_crds()
        m = write_crd_schemas(crds, out / "crd-schemas")
        log(f"kubeconform schemas: {n} Kubernetes kinds ({k8s['version']}), {m} CRD kinds")

    return support.cached("kubeconform", key, make)


def prometheus_operator_crds() -> list[dict]:
    yaml = support.pyyaml()
    path, version, want = PROM_OPERATOR
    with tempfile.TemporaryDirectory() as tmp:
        env = {**gotool.go_env(), "GOFLAGS": "-modcacherw -mod=mod", "GO111MODULE": "on"}
        out = run(["go", "mod", "download", "-json", f"{path}@{version}"], what="go mod download", cwd=tmp, env=env)
    d = json.loads(out)
    if d.get("Sum") != want:
        raise ClusterError(f"{path}@{version}: module sum {d.get('Sum')} != pinned {want}")
    base = Path(d["Dir"]) / "example" / "prometheus-operator-crd"
    return [yaml.safe_load((base / f).read_text()) for f in PROM_OPERATOR_CRDS]
