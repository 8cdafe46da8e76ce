"""KEDA's HTTP add-on (operator, external scaler, interceptor) for scale to zero, built from the pinned module and run
as host processes under the add-on's own service accounts beside KEDA. The interceptor resolves Services through the
node's CoreDNS in a private mount namespace; the scaler finds it through an EndpointSlice on the host's address; KEDA
reaches the scaler at 127.0.0.1 (see NOTES.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
from pathlib import Path

from .. import gotool, processes
from ..addons import keda, support
from ..addons.support import kubectl, launch, wait
from ..apiclient import http_ok
from ..base import ClusterError, log
from ..state import save_state

KEDA_HTTP_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w,version cmds=operator,scaler,interceptor config=crd,rbac"
KEDA_HTTP_MODULE = "github.com/kedacore/http-add-on"
#: the add-on's kustomize namePrefix: its Services, accounts and roles are called so in the add-on's chart too
KEDA_HTTP_PREFIX = "keda-add-ons-http-"
KEDA_HTTP_PARTS = ("operator", "scaler", "interceptor")
#: its process names in the cluster's state, in start order
PROCESSES = tuple(f"keda-http-{p}" for p in KEDA_HTTP_PARTS)
NAMESPACE = keda.NAMESPACE


def keda_http_dir() -> Path:
    """The add-on's three commands, built in one invocation (their shared packages compile once)."""
    key = support.key(KEDA_HTTP_RECIPE.encode(), *support.module_files("keda-http/go.mod", "keda-http/go.sum"))

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("keda-http", KEDA_HTTP_MODULE)
        stamp = f"{KEDA_HTTP_MODULE}/pkg/build"
        ldflags = f"-s -w -X {stamp}.version={info['version']} -X {stamp}.gitCommit={info['commit']}"
        bins = out / ".bin"
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-ldflags", ldflags, "-o", f"{bins}/",
             *(f"{KEDA_HTTP_MODULE}/{cmd}" for cmd in KEDA_HTTP_PARTS)],
            "keda-http",
        )  # fmt: skip
        for cmd in KEDA_HTTP_PARTS:  # `go build -o dir/` names each binary after its package
            (bins / cmd).rename(out / f"keda-http-{cmd}")
        bins.rmdir()
        src = Path(info["dir"]) / "config"
        shutil.copytree(src / "crd" / "bases", out / "config" / "crd")
        for part in KEDA_HTTP_PARTS:
            (out / "config" / part).mkdir(parents=True, exist_ok=True)
            for f in ("role.yaml", "role-binding.yaml", "service-account.yaml"):
                shutil.copy(src / part / f, out / "config" / part / f)
        (out / "VERSION").write_text(info["version"] + "\n")

    return support.cached("keda-http", key, make)


def keda_http_rbac(hdir: Path) -> list[dict]:
    """Service accounts and roles from the add-on's config/, as its kustomizations render them: the
    ``keda-add-ons-http-`` name prefix and the ``keda`` namespace on the objects and the subjects."""
    yaml = support.pyyaml()
    docs: list[dict] = []
    for part in KEDA_HTTP_PARTS:
        for f in ("service-account.yaml", "role.yaml", "role-binding.yaml"):
            docs += [d for d in yaml.safe_load_all((hdir / "config" / part / f).read_text()) if d]
    ours = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for d in docs:
        d["metadata"]["name"] = KEDA_HTTP_PREFIX + d["metadata"]["name"]
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            d["metadata"]["namespace"] = NAMESPACE
        ref = d.get("roleRef")
        if ref and (ref["kind"], ref["name"]) in ours:  # system:auth-delegator stays as it is
            ref["name"] = KEDA_HTTP_PREFIX + ref["name"]
        for sub in d.get("subjects") or ():
            sub["name"], sub["namespace"] = KEDA_HTTP_PREFIX + sub["name"], NAMESPACE
    return docs


def keda_http_manifests(hdir: Path, host: str, admin_port: int) -> str:
    """CRDs, RBAC, and the interceptor's admin Service with an EndpointSlice on the host's address: the
    scaler asks every interceptor for its queue counts at the addresses of that Service's slices."""
    yaml = support.pyyaml()
    docs = [yaml.safe_load(f.read_text()) for f in sorted((hdir / "config" / "crd").glob("*.yaml"))]
    docs += keda_http_rbac(hdir)
    admin = KEDA_HTTP_PREFIX + "interceptor-admin"
    labels = {"app.kubernetes.io/name": "http-add-on", "app.kubernetes.io/component": "interceptor"}
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": admin, "namespace": NAMESPACE, "labels": labels},
            "spec": {"ports": [{"name": "admin", "port": admin_port, "protocol": "TCP"}]},
        }
    )
    docs.append(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{admin}-host",
                "namespace": NAMESPACE,
                "labels": {**labels, "kubernetes.io/service-name": admin,
                           "endpointslice.kubernetes.io/managed-by": "kubeinfer-cluster"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
            "ports": [{"name": "admin", "port": admin_port, "protocol": "TCP"}],
        }
    )  # fmt: skip
    return "\n---\n".join(json.dumps(d) for d in docs)


def in_cluster_dns(node: dict, resolv: Path, cmd: list[str]) -> list[str]:
    """``cmd`` in a private mount namespace whose /etc/resolv.conf names the node's CoreDNS: the
    interceptor dials ``<service>.<namespace>:<port>``, names only the cluster's DNS knows."""
    resolv.write_text(
        f"nameserver {node['dns_ip']}\nsearch svc.cluster.local cluster.local\noptions ndots:5 timeout:1\n"
    )
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv), *cmd]  # fmt: skip


def listening(port: int) -> bool:
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=1)):
        return True


def start_keda_http(rd: Path, state: dict, hdir: Path, timeout: float) -> None:
    node = state.get("node")
    if not node:
        raise ClusterError(
            "the keda-http add-on needs the real worker node (its interceptor proxies to Services through "
            "the node's DNS and kube-proxy); this cluster runs without one (KUBEINFER_CLUSTER_NODE=0?)"
        )
    home = rd / "addons" / "keda-http"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (op_metrics, op_probe, scaler_grpc, scaler_metrics, proxy, proxy_tls, admin,
     icpt_metrics) = processes.free_ports(8)  # fmt: skip
    host = node["host_ip"]  # the host's end of the node's veth: an address EndpointSlices accept
    kubectl(state, "apply", "--server-side", "--force-conflicts", "--field-manager=kubeinfer-cluster", "-f", "-",
            input=keda_http_manifests(hdir, host, admin))  # fmt: skip

    def established() -> bool:
        for crd in ("interceptorroutes.http.keda.sh", "httpscaledobjects.http.keda.sh"):
            conds = json.loads(kubectl(state, "get", "crd", crd, "-o", "json")).get("status", {}).get("conditions")
            if not any(x["type"] == "Established" and x["status"] == "True" for x in conds or ()):
                return False
        return True

    wait("the HTTP add-on's CRDs Established", established, [], timeout)
    version = (hdir / "VERSION").read_text().strip()
    zap = ["--zap-log-level=info", "--zap-encoder=console", "--zap-time-encoding=rfc3339"]

    def env_for(part: str, **extra: str) -> dict:
        kc = home / f"{part}.kubeconfig"
        keda.service_account_kubeconfig(state, kc, KEDA_HTTP_PREFIX + part)
        return {**os.environ, "KUBECONFIG": str(kc), **extra}

    operator = launch(
        rd, state, "keda-http-operator",
        [str(hdir / "keda-http-operator"), f"--metrics-bind-address=127.0.0.1:{op_metrics}",
         f"--health-probe-bind-address=127.0.0.1:{op_probe}", *zap],
        env_for("operator", KEDA_HTTP_OPERATOR_NAMESPACE=NAMESPACE,
                KEDA_HTTP_OPERATOR_EXTERNAL_SCALER_SERVICE=KEDA_HTTP_PREFIX + "external-scaler",
                KEDA_HTTP_OPERATOR_EXTERNAL_SCALER_PORT=str(scaler_grpc)),
    )  # fmt: skip
    interceptor = launch(
        rd, state, "keda-http-interceptor",
        in_cluster_dns(node, home / "resolv.conf", [str(hdir / "keda-http-interceptor"), *zap]),
        env_for("interceptor", KEDA_HTTP_PROXY_PORT=str(proxy), KEDA_HTTP_ADMIN_PORT=str(admin),
                KEDA_HTTP_PROXY_TLS_PORT=str(proxy_tls), OTEL_PROM_EXPORTER_PORT=str(icpt_metrics),
                # answers while a pool wakes from zero: no readiness deadline beyond the request's own
                KEDA_HTTP_READINESS_TIMEOUT="0s", KEDA_HTTP_CONNECT_TIMEOUT="2s"),
    )  # fmt: skip
    scaler = launch(
        rd, state, "keda-http-scaler",
        [str(hdir / "keda-http-scaler"), *zap],
        env_for("scaler", KEDA_HTTP_SCALER_PORT=str(scaler_grpc), KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE=NAMESPACE,
                KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE=KEDA_HTTP_PREFIX + "interceptor-admin",
                KEDA_HTTP_SCALER_TARGET_ADMIN_DEPLOYMENT=KEDA_HTTP_PREFIX + "interceptor",
                KEDA_HTTP_SCALER_TARGET_ADMIN_PORT=str(admin), OTEL_PROM_EXPORTER_PORT=str(scaler_metrics)),
    )  # fmt: skip
    comps = [operator, interceptor, scaler]
    wait("the HTTP add-on's operator /readyz", lambda: http_ok(f"http://127.0.0.1:{op_probe}/readyz", insecure=False),
         comps, timeout)  # fmt: skip
    wait("the interceptor's /readyz", lambda: http_ok(f"http://127.0.0.1:{admin}/readyz", insecure=False), comps,
         timeout)  # fmt: skip
    wait("the scaler's gRPC port", lambda: listening(scaler_grpc), comps, timeout)
    for comp in comps:
        comp["version"] = version
    interceptor["url"] = f"http://127.0.0.1:{proxy}"
    scaler["address"] = f"127.0.0.1:{scaler_grpc}"
    save_state(rd, state)
    log(f"KEDA HTTP add-on {version}: interceptor proxy {interceptor['url']}, external scaler {scaler['address']}")
