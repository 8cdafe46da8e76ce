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
* ``kubeconform`` -- always built with the cluster (seconds): the binary plus JSON schemas
  generated offline from the pinned Kubernetes module's ``api/openapi-spec/swagger.json`` (the
  document the apiserver serves) and from the CRDs of KEDA and the Prometheus Operator.

Add-ons are opt-in: ``up --addons prometheus,keda`` (or ``KUBEINFER_CLUSTER_ADDONS``) starts the
missing ones on a new or running cluster; ``down``/``release`` stop them with the cluster. Each is
cached like the control-plane binaries, under ``<cache>/addons/<name>-<hash of its inputs>``.

``python3 e2e/cluster/addons.py crd-schemas OUT CRD.yaml...`` writes kubeconform schemas for CRDs
(used by the tests for our own CRDs, which change with the code); ``kubeconform-dir`` prints (and
builds if needed) the kubeconform folder.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from localcluster import apiclient, base, gotool, pki, processes, scaffold
from localcluster.base import ClusterError
from localcluster.processes import alive, tail
from localcluster.state import save_state

HERE = Path(__file__).resolve().parent
ADDONS = ("prometheus", "keda")
KEDA_VERSION = "v2.21.0"
#: CRDs of the Prometheus Operator (ServiceMonitor/PodMonitor), for validating the chart's optional monitors.
#: Pinned with the module's go.sum hash (checked after download).
PROM_OPERATOR = (
    "github.com/prometheus-operator/prometheus-operator",
    "v0.85.0",
    "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=",
)
PROM_OPERATOR_CRDS = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_podmonitors.yaml")
KEDA_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w cmds=operator,adapter config=crd,rbac,metrics-server"
# bump when the schema conversion below changes
KUBECONFORM_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w schemas=swagger-v2-strict+keda+monitoring"
PROMETHEUS_RECIPE = "v1 trimpath cgo=0 tags=netgo,stringlabels ldflags=-s,-w,version-stamps"
#: promu's tags, less builtinassets (the web UI needs an npm build; the API is all the tests use)
PROMETHEUS_TAGS = "netgo,stringlabels"
NAMESPACE = "keda"
SCRAPE_INTERVAL = os.environ.get("KUBEINFER_PROMETHEUS_SCRAPE_INTERVAL", "2s")
SERVER_NAMES = ("keda-operator", "keda-metrics-apiserver")


def log(msg: str) -> None:
    base.log(msg)


def selected(arg: str | None) -> list[str]:
    """Add-on names from ``--addons`` (else ``KUBEINFER_CLUSTER_ADDONS``), checked."""
    raw = arg if arg is not None else os.environ.get("KUBEINFER_CLUSTER_ADDONS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in ADDONS]
    if unknown:
        raise ClusterError(f"unknown add-on(s) {unknown}; known: {', '.join(ADDONS)}")
    return [n for n in ADDONS if n in names]


def _yaml() -> Any:
    """PyYAML: KEDA's and the Prometheus Operator's manifests are YAML (the project's .venv has it)."""
    try:
        import yaml
    except ImportError as e:
        raise ClusterError(
            "the add-ons read YAML manifests: run with a Python that has PyYAML (.venv/bin/python)"
        ) from e
    return yaml


def addons_dir() -> Path:
    return base.cache_dir() / "addons"


def _hash(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()[:16]


def _files(*rel: str) -> list[bytes]:
    return [(HERE / r).read_bytes() for r in rel]


def _cached(name: str, key: str, make) -> Path:
    """``<cache>/addons/<name>-<key>``, made by ``make(tmpdir)`` once (atomic rename, under a lock)."""
    target = addons_dir() / f"{name}-{key}"
    if (target / ".complete").exists():
        return target
    with scaffold.flock(addons_dir() / f".{name}.lock"):
        if (target / ".complete").exists():
            return target
        t0 = time.monotonic()
        log(f"building add-on {name} into {target}")
        tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            make(tmp)
            (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"add-on {name} built in {time.monotonic() - t0:.0f}s")
    return target


# --------------------------------------------------------------------------------------------- KEDA


def keda_dir() -> Path:
    key = _hash(KEDA_RECIPE.encode(), *_files("keda/go.mod", "keda/go.sum"))

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("keda", "github.com/kedacore/keda/v2")
        for cmd, binary in (("operator", "keda-operator"), ("adapter", "keda-adapter")):
            gotool.go(
                [
                    "build", "-p", jobs, "-trimpath",
                    "-ldflags", f"-s -w -X github.com/kedacore/keda/v2/version.Version={info['version']}",
                    "-o", str(out / binary), f"github.com/kedacore/keda/v2/cmd/{cmd}",
                ],
                "keda",
            )  # fmt: skip
        src = Path(info["dir"]) / "config"
        for sub in ("crd/bases", "crd/patches", "rbac", "metrics-server", "service_account", "general"):
            shutil.copytree(src / sub, out / "config" / sub)
        (out / "VERSION").write_text(info["version"] + "\n")

    return _cached("keda", key, make)


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
    yaml = _yaml()

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


# ----------------------------------------------------------------------------------------- Prometheus


def prometheus_dir() -> Path:
    """Prometheus 2.x built from its pinned module (``e2e/cluster/prometheus``), version-stamped as promu does.

    Not Debian's ``prometheus`` package: Debian builds it without Kubernetes service discovery
    (``promtool check config`` of a ``kubernetes_sd_configs`` job: "field kubernetes_sd_configs not found
    in type config.ScrapeConfig"; its binary has no discovery/kubernetes package) -- see NOTES.md.
    """
    key = _hash(PROMETHEUS_RECIPE.encode(), *_files("prometheus/go.mod", "prometheus/go.sum"))

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

    return _cached("prometheus", key, make)


def _run(cmd: list[str], what: str, cwd: str | None = None, input: str | None = None, env: dict | None = None) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, input=input, env=env)
    except FileNotFoundError as e:
        raise ClusterError(f"{what}: {cmd[0]} not found") from e
    if p.returncode != 0:
        raise ClusterError(
            f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-4000:]}{p.stderr[-4000:]}"
        )
    return p.stdout


# ---------------------------------------------------------------------------------------- kubeconform


def kubeconform_dir() -> Path:
    key = _hash(
        KUBECONFORM_RECIPE.encode(),
        *_files("kubeconform/go.mod", "kubeconform/go.sum", "k8s/go.mod", "keda/go.mod"),
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

    return _cached("kubeconform", key, make)


def keda_crds_from_module() -> list[dict]:
    """KEDA's CRDs straight from the module (no build): same files ``keda_dir`` copies."""
    info = gotool.module_info("keda", "github.com/kedacore/keda/v2")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(Path(info["dir"]) / "config" / "crd", Path(tmp) / "config" / "crd")
        return keda_crds(Path(tmp))


def prometheus_operator_crds() -> list[dict]:
    yaml = _yaml()
    path, version, want = PROM_OPERATOR
    with tempfile.TemporaryDirectory() as tmp:
        env = {**gotool.go_env(), "GOFLAGS": "-modcacherw -mod=mod", "GO111MODULE": "on"}
        out = _run(["go", "mod", "download", "-json", f"{path}@{version}"], what="go mod download", cwd=tmp, env=env)
    d = json.loads(out)
    if d.get("Sum") != want:
        raise ClusterError(f"{path}@{version}: module sum {d.get('Sum')} != pinned {want}")
    base = Path(d["Dir"]) / "example" / "prometheus-operator-crd"
    return [yaml.safe_load((base / f).read_text()) for f in PROM_OPERATOR_CRDS]


# ---- JSON schemas for kubeconform (what instrumenta/openapi2jsonschema does with --strict --stand-alone)

_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"


def _k8s_fix(node: Any) -> Any:
    """Swagger 2 → JSON schema: int-or-string and quantities take both forms; objects are strict."""
    if isinstance(node, list):
        return [_k8s_fix(x) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string":
        return {"oneOf": [{"type": "string"}, {"type": "integer"}], "description": node.get("description", "")}
    out = {k: _k8s_fix(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _refs(node: Any, acc: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            acc.add(ref.removeprefix("#/definitions/"))
        for v in node.values():
            _refs(v, acc)
    elif isinstance(node, list):
        for v in node:
            _refs(v, acc)


def write_k8s_schemas(swagger: dict, out: Path) -> int:
    """One standalone file per kind (``deployment-apps-v1.json``), with the definitions it uses."""
    defs = {name: _k8s_fix(d) for name, d in swagger["definitions"].items()}
    defs[_QUANTITY] = {"oneOf": [{"type": "string"}, {"type": "number"}], "description": "Kubernetes quantity"}
    defs[_INT_OR_STRING] = {"oneOf": [{"type": "string"}, {"type": "integer"}], "description": "int or string"}
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, d in defs.items():
        for gvk in swagger["definitions"][name].get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            if kind.endswith("List") or kind in ("WatchEvent", "DeleteOptions", "Status", "APIVersions"):
                continue
            need: set[str] = set()
            _refs(d, need)
            todo = list(need)
            while todo:
                more: set[str] = set()
                _refs(defs[todo.pop()], more)
                for r in more - need:
                    need.add(r)
                    todo.append(r)
            schema = copy.deepcopy(d)
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [f"{group}/{version}" if group else version]}
            props["kind"] = {"type": "string", "enum": [kind]}
            schema["definitions"] = {r: defs[r] for r in sorted(need)}
            schema["$schema"] = "http://json-schema.org/schema#"
            suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
            (out / f"{kind.lower()}{suffix}.json").write_text(json.dumps(schema))
            written += 1
    return written


def _crd_fix(node: Any) -> Any:
    """CRD openAPIV3Schema → JSON schema: strict objects unless unknown fields are preserved."""
    if isinstance(node, list):
        return [_crd_fix(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _crd_fix(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out.pop("type", None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("x-kubernetes-embedded-resource"):
        out.setdefault("properties", {})
    return out


def write_crd_schemas(crds: list[dict], out: Path) -> int:
    """``<group>/<kind>_<version>.json`` per served version (the layout of Datree's CRDs-catalog)."""
    written = 0
    for crd in crds:
        spec = crd["spec"]
        for v in spec["versions"]:
            if not v.get("served", True):
                continue
            schema = _crd_fix(v["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string", "enum": [f"{spec['group']}/{v['name']}"]}
            props["kind"] = {"type": "string", "enum": [spec["names"]["kind"]]}
            props["metadata"] = {"type": "object"}
            schema["$schema"] = "http://json-schema.org/schema#"
            d = out / spec["group"]
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{spec['names']['kind'].lower()}_{v['name']}.json").write_text(json.dumps(schema))
            written += 1
    return written


# ------------------------------------------------------------------------------------------ processes


def _launch(rd: Path, state: dict, name: str, cmd: list[str], env: dict | None = None) -> dict:
    pid, st = processes.spawn(cmd, rd / "logs" / f"{name}.log", rd, f"starting {name}", env)
    comp = {"pid": pid, "starttime": st, "log": str(rd / "logs" / f"{name}.log"), "cmd": cmd}
    state.setdefault("addons", {})[name] = comp
    (rd / "pids" / f"{name}.pid").write_text(f"{pid}\n")
    save_state(rd, state)
    return comp


def _wait(what: str, check, comps: list[dict], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for comp in comps:
            if not alive(comp):
                raise ClusterError(f"{comp['cmd'][0]} exited while waiting for {what}:\n{tail(Path(comp['log']))}")
        try:
            if check():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {x['log']}\n{tail(Path(x['log']), 25)}" for x in comps)
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(0.5)


def _kubectl(state: dict, *args: str, input: str | None = None, kubeconfig: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": kubeconfig or state["kubeconfig"]}
    return _run([str(Path(state["bin_dir"]) / "kubectl"), *args], what=f"kubectl {args[0]}", input=input, env=env)


def _stop(comp: dict, name: str) -> bool:
    if not alive(comp):
        return False
    os.kill(comp["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 20
    while alive(comp) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(comp):
        log(f"{name} (pid {comp['pid']}) ignored SIGTERM; sending SIGKILL")
        os.kill(comp["pid"], signal.SIGKILL)
        while alive(comp):
            time.sleep(0.1)
    return True


def stop(rd: Path, state: dict) -> list[str]:
    """Stop every add-on process recorded in the state (``down``/``release`` call this first)."""
    stopped = []
    for name, comp in reversed(list((state.get("addons") or {}).items())):
        if _stop(comp, name):
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
        start_prometheus(rd, state, prometheus_dir(), timeout)
    if "keda" in names and not all(running.get(n) and alive(running[n]) for n in ("keda-operator", "keda-adapter")):
        for n in ("keda-adapter", "keda-operator"):
            if running.get(n):
                _stop(running.pop(n), n)
        start_keda(rd, state, keda_dir(), timeout)
    save_state(rd, state)
    return time.monotonic() - t0


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
    comp = _launch(
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
    _wait("Prometheus /-/ready", lambda: apiclient.http_ok(f"{url}/-/ready", insecure=False), [comp], timeout)
    save_state(rd, state)
    log(f"Prometheus {comp['version']} at {url} (scrape interval {SCRAPE_INTERVAL})")


def _keda_certs(certs: Path) -> None:
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


def _service_account_kubeconfig(state: dict, path: Path) -> None:
    """A kubeconfig for KEDA's own service account (its RBAC from config/ is what the processes get)."""
    token = _kubectl(state, "-n", NAMESPACE, "create", "token", "keda-operator", "--duration=8760h").strip()
    ca = Path(state["pki"]) / "ca.crt"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "local", "cluster": {"server": state["server"], "certificate-authority": str(ca)}}
                ],
                "users": [{"name": "keda-operator", "user": {"token": token}}],
                "contexts": [{"name": "keda", "context": {"cluster": "local", "user": "keda-operator"}}],
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
    import base64

    yaml = _yaml()

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
    _keda_certs(certs)
    op_metrics, op_probe, grpc_port, adapter_port, adapter_metrics = processes.free_ports(5)
    manifests = keda_manifests(kdir, certs, adapter_port)
    _kubectl(state, "apply", "--server-side", "--force-conflicts", "--field-manager=kubeinfer-cluster", "-f", "-",
             input=manifests)  # fmt: skip

    def established() -> bool:
        for crd in ("scaledobjects.keda.sh", "triggerauthentications.keda.sh"):
            conds = json.loads(_kubectl(state, "get", "crd", crd, "-o", "json")).get("status", {}).get("conditions")
            if not any(x["type"] == "Established" and x["status"] == "True" for x in conds or ()):
                return False
        return True

    _wait("KEDA's CRDs Established", established, [], timeout)
    kc = home / "kubeconfig"
    _service_account_kubeconfig(state, kc)
    env = {
        **os.environ,
        "KUBECONFIG": str(kc),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        "KEDA_HTTP_DEFAULT_TIMEOUT": "3000",
    }
    operator = _launch(
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
    _wait("KEDA operator /readyz", lambda: apiclient.http_ok(f"http://127.0.0.1:{op_probe}/readyz", insecure=False),
          [operator], timeout)  # fmt: skip
    adapter = _launch(
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
        out = _kubectl(state, "get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "json")
        conds = json.loads(out).get("status", {}).get("conditions", [])
        return any(x["type"] == "Available" and x["status"] == "True" for x in conds)

    _wait("APIService v1beta1.external.metrics.k8s.io Available", available, [operator, adapter], timeout)
    operator["version"] = adapter["version"] = (kdir / "VERSION").read_text().strip()
    save_state(rd, state)
    log(f"KEDA {operator['version']}: operator and metrics adapter running, external metrics API available")


def ensure_built(names: list[str]) -> dict[str, str]:
    """Build/fetch kubeconform (always: the chart tests need it) and the named add-ons."""
    out = {"kubeconform": str(kubeconform_dir())}
    if "prometheus" in names:
        out["prometheus"] = str(prometheus_dir())
    if "keda" in names:
        out["keda"] = str(keda_dir())
    return out


def describe(state: dict) -> dict:
    out = {}
    for name, comp in (state.get("addons") or {}).items():
        if alive(comp):
            out[name] = {k: comp[k] for k in ("pid", "log", "url", "version") if k in comp}
    return out


def main(argv: list[str]) -> int:
    if argv == ["kubeconform-dir"]:
        try:
            print(kubeconform_dir())
        except ClusterError as e:
            log(f"ERROR: {e}")
            return 1
        return 0
    if len(argv) >= 2 and argv[0] == "crd-schemas":
        yaml = _yaml()
        crds = [d for f in argv[2:] for d in yaml.safe_load_all(Path(f).read_text()) if d]
        print(write_crd_schemas(crds, Path(argv[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
