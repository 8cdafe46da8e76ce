"""KEDA's operator and metrics adapter, built from the pinned module and run as host processes under KEDA's own
service account; the adapter serves the external metrics API through an ExternalName Service (see NOTES.md)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import gotool, pki, processes
from ..addons import support
from ..addons.support import kubectl, launch, wait
from ..apiclient import http_ok
from ..base import ClusterError, log
from ..state import save_state

KEDA_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w cmds=operator,adapter config=crd,rbac,metrics-server"
NAMESPACE = "keda"
SERVER_NAMES = ("keda-operator", "keda-metrics-apiserver")


def keda_dir() -> Path:
    key = support.key(KEDA_RECIPE.encode(), *support.module_files("keda/go.mod", "keda/go.sum"))

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("keda", "github.com/kedacore/keda/v2")
        # both commands in one invocation: one links while the other compiles (the binaries are the same bytes
        # as from two invocations, so the recipe and its cache key stay)
        bins = out / ".bin"
        gotool.go(
            [
                "build", "-p", jobs, "-trimpath",
                "-ldflags", f"-s -w -X github.com/kedacore/keda/v2/version.Version={info['version']}",
                "-o", f"{bins}/", *(f"github.com/kedacore/keda/v2/cmd/{cmd}" for cmd in ("operator", "adapter")),
            ],
            "keda",
        )  # fmt: skip
        for cmd in ("operator", "adapter"):
            (bins / cmd).rename(out / f"keda-{cmd}")
        bins.rmdir()
        src = Path(info["dir"]) / "config"
        for sub in ("crd/bases", "crd/patches", "rbac", "metrics-server", "service_account", "general"):
            shutil.copytree(src / sub, out / "config" / sub)
        (out / "VERSION").write_text(info["version"] + "\n")

    return support.cached("keda", key, make)


def json_patch(doc: dict, op: dict) -> None:
    """RFC 6902 ``add``/``remove``, the operations KEDA's CRD patches use (kustomize applies them there)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    node: Any = doc
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    if op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), op["value"])
        else:
            node[last] = op["value"]
    elif op["op"] == "remove":
        del node[int(last) if isinstance(node, list) else last]
    else:
        raise ClusterError(f"JSON patch op {op['op']} is not supported here")


def keda_crds(kdir: Path) -> list[dict]:
    """KEDA's CRDs as its kustomization renders them (bases + the JSON patches it lists)."""
    yaml = support.pyyaml()

    crds = {}
    for f in sorted((kdir / "config/crd/bases").glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        crds[doc["metadata"]["name"]] = doc
    for name, patch in (
        ("scaledobjects.keda.sh", "scaledobject_patch.yaml"),
        ("scaledjobs.keda.sh", "scaledjob_patch.yaml"),
    ):
        for op in yaml.safe_load((kdir / "config/crd/patches" / patch).read_text()) or []:
            json_patch(crds[name], op)
    return list(crds.values())


def keda_crds_from_module() -> list[dict]:
    """KEDA's CRDs straight from the module (no build): same files ``keda_dir`` copies."""
    info = gotool.module_info("keda", "github.com/kedacore/keda/v2")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(Path(info["dir"]) / "config" / "crd", Path(tmp) / "config" / "crd")
        return keda_crds(Path(tmp))


def keda_certs(certs: Path) -> None:
    """One CA and one certificate for both KEDA processes: the adapter serves the aggregated API with it
    (the apiserver checks ``keda-metrics-apiserver.keda.svc``) and the two talk mutual TLS over gRPC."""
    certs.mkdir(parents=True, exist_ok=True)
    o = lambda *a: pki.openssl(*a, cwd=certs)  # noqa: E731
    o("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
      "-subj", "/O=KEDAORG/CN=KEDA", "-addext", "basicConstraints=critical,CA:TRUE",
      "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")  # fmt: skip
    sans = ["IP:127.0.0.1", "DNS:localhost"] + [
        f"DNS:{s}.{NAMESPACE}.{suffix}" for s in SERVER_NAMES for suffix in ("svc", "svc.cluster.local")
    ]
    (certs / "tls.ext").write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={','.join(sans)}\n"
    )
    o("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/O=KEDAORG/CN=keda")
    o("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "tls.crt",
      "-days", "3650", "-sha256", "-extfile", "tls.ext")  # fmt: skip
    for k in certs.glob("*.key"):
        k.chmod(0o600)


def service_account_kubeconfig(state: dict, path: Path, account: str = "keda-operator") -> None:
    """A kubeconfig for one of KEDA's own service accounts (its RBAC from config/ is what the processes get)."""
    token = kubectl(state, "-n", NAMESPACE, "create", "token", account, "--duration=8760h").strip()
    ca = Path(state["pki"]) / "ca.crt"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "local", "cluster": {"server": state["server"], "certificate-authority": str(ca)}}
                ],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "keda", "context": {"cluster": "local", "user": account}}],
                "current-context": "keda",
            }
        )
    )
    path.chmod(0o600)


def keda_manifests(kdir: Path, certs: Path, port: int) -> str:
    """Namespace, service account, RBAC and CRDs from KEDA's config/, plus the APIService and its Service.

    The adapter runs on the host, so its Service is an ExternalName pointing at 127.0.0.1, and the
    APIService names the adapter's (free, unprivileged) port: for an ExternalName Service the
    aggregator dials ``<externalName>:<APIService port>``.
    """
    yaml = support.pyyaml()

    cfg = kdir / "config"
    docs: list[dict] = []
    for rel in ("general/namespace.yaml", "service_account/service_account.yaml", "rbac/role.yaml",
                "rbac/role_binding.yaml", "rbac/aggregate_cluster_roles.yaml", "metrics-server/role.yaml",
                "metrics-server/role_binding.yaml"):  # fmt: skip
        docs += [d for d in yaml.safe_load_all((cfg / rel).read_text()) if d]
    docs += keda_crds(kdir)
    (api_service,) = yaml.safe_load_all((cfg / "metrics-server/api_service.yaml").read_text())
    api_service["spec"]["service"]["port"] = port
    api_service["spec"]["caBundle"] = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    docs.append(api_service)
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "keda-metrics-apiserver", "namespace": NAMESPACE,
                         "labels": {"app.kubernetes.io/name": "keda-metrics-apiserver"}},
            "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
        }
    )  # fmt: skip
    return "\n---\n".join(json.dumps(d) for d in docs)


def start_keda(rd: Path, state: dict, kdir: Path, timeout: float) -> None:
    home = rd / "addons" / "keda"
    shutil.rmtree(home, ignore_errors=True)
    certs = home / "certs"
    keda_certs(certs)
    op_metrics, op_probe, grpc_port, adapter_port, adapter_metrics = processes.free_ports(5)
    manifests = keda_manifests(kdir, certs, adapter_port)
    kubectl(state, "apply", "--server-side", "--force-conflicts", "--field-manager=kubeinfer-cluster", "-f", "-",
             input=manifests)  # fmt: skip

    def established() -> bool:
        for crd in ("scaledobjects.keda.sh", "triggerauthentications.keda.sh"):
            conds = json.loads(kubectl(state, "get", "crd", crd, "-o", "json")).get("status", {}).get("conditions")
            if not any(x["type"] == "Established" and x["status"] == "True" for x in conds or ()):
                return False
        return True

    wait("KEDA's CRDs Established", established, [], timeout)
    kc = home / "kubeconfig"
    service_account_kubeconfig(state, kc)
    env = {
        **os.environ,
        "KUBECONFIG": str(kc),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        "KEDA_HTTP_DEFAULT_TIMEOUT": "3000",
    }
    operator = launch(
        rd,
        state,
        "keda-operator",
        [
            str(kdir / "keda-operator"),
            "--zap-log-level=info",
            "--zap-encoder=console",
            "--zap-time-encoding=rfc3339",
            f"--metrics-bind-address=127.0.0.1:{op_metrics}",
            f"--health-probe-bind-address=127.0.0.1:{op_probe}",
            f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
            f"--cert-dir={certs}",
            f"--ca-dir={certs}",
            "--enable-cert-rotation=false",
        ],
        env,
    )
    wait("KEDA operator /readyz", lambda: http_ok(f"http://127.0.0.1:{op_probe}/readyz", insecure=False),
          [operator], timeout)  # fmt: skip
    adapter = launch(
        rd,
        state,
        "keda-adapter",
        [
            str(kdir / "keda-adapter"),
            f"--secure-port={adapter_port}",
            "--bind-address=127.0.0.1",
            f"--port={adapter_metrics}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--client-ca-file={certs / 'ca.crt'}",
            f"--cert-dir={certs}",
            f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--metrics-service-address=127.0.0.1:{grpc_port}",
            "--zap-log-level=info",
        ],
        env,
    )

    def available() -> bool:
        out = kubectl(state, "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json")
        conds = json.loads(out).get("status", {}).get("conditions", [])
        return any(x["type"] == "Available" and x["status"] == "True" for x in conds)

    wait("APIService v1beta1.external.metrics.k8s.io Available", available, [operator, adapter], timeout)
    operator["version"] = adapter["version"] = (kdir / "VERSION").read_text().strip()
    save_state(rd, state)
    log(f"KEDA {operator['version']}: operator and metrics adapter running, external metrics API available")
