#!/usr/bin/env python3
"""Local Kubernetes control plane built from pinned Go modules (no containers).

Sub-commands (the executables ``up``, ``down``, ``env`` and ``build`` next to this
file call them):

  build   build the binaries into the cache (no-op when already built for these pins)
  up      build if needed, then start etcd, kube-apiserver, kube-controller-manager,
          kube-scheduler and kwok (one fake GPU node) on 127.0.0.1 with free ports;
          reuses a running, healthy cluster; prints ``export`` lines on stdout
  down    stop exactly the processes ``up`` started (PIDs from the run folder)
  env     print the ``export`` lines of the running cluster (exit 1 if none)
  release drop a ``up --hold PID`` registration; stops the cluster when it was started
          with --hold and no registered process is alive any more (pytest fixture)
  restart COMPONENT [--down-seconds N]
          stop one component and start it again with the same flags (fault drills);
          only on a run folder of one's own (KUBEINFER_CLUSTER_RUN)

``up`` and ``env`` accept ``--json`` to print a JSON document instead of shell lines.
Human-readable progress goes to stderr, so ``eval "$(e2e/cluster/up)"`` works.

Environment:
  KUBEINFER_CLUSTER_CACHE  cache folder (default ~/.cache/kubeinfer-cluster);
                           binaries go to <cache>/bin-<hash of go.mod/go.sum files>
  KUBEINFER_CLUSTER_RUN    run folder: PIDs, logs, PKI, etcd data, kubeconfig
                           (default <cache>/run)
  KUBEINFER_GO_BUILD_P     go build -p (default 2)
  KUBEINFER_GOTOOLCHAIN    GOTOOLCHAIN for the build (default "local")
  KUBEINFER_CLUSTER_TIMEOUT  seconds to wait for the cluster to become ready (default 180)

Only the Python standard library, ``go`` (for building) and ``openssl`` are needed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from localcluster import node  # noqa: E402  (the real worker node)
from localcluster.node import cgroups, configs, containerd, lifecycle, network, storage  # noqa: E402

MODULES = ("k8s", "etcd", "kwok", "helm", "coredns")

# Bump when the build recipe below changes (tags, ldflags, outputs): it is part of the
# bin-<hash> name so a changed recipe never reuses stale binaries.
BUILD_RECIPE = "v2 tags=selinux,notest,grpcnotrace trimpath cgo=0 ldflags=-s,-w,version-stamps pause=gcc-static"
K8S_TAGS = "selinux,notest,grpcnotrace"
K8S_CMDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "kube-proxy")
BINARIES = K8S_CMDS + ("etcd", "kwok", "helm", "coredns", "pause")
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
NODE_NAME = "kwok-gpu-node-0"
#: tries of a start whose component lost its port to another process between choosing and binding
START_ATTEMPTS = 3
#: GPU nodes carry this taint (as on GKE/AKS); the ExtendedResourceToleration admission plugin gives
#: every pod that asks for nvidia.com/gpu the toleration, so CPU-only pods land on the real node.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
POD_CIDR = "10.244.0.0/16"


def log(msg: str) -> None:
    print(f"[kubeinfer-cluster] {msg}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    pass


# --------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "kubeinfer-cluster"
    return Path(os.environ.get("KUBEINFER_CLUSTER_CACHE") or default).expanduser()


def run_dir() -> Path:
    return Path(os.environ.get("KUBEINFER_CLUSTER_RUN") or cache_dir() / "run").expanduser()


def pins_hash() -> str:
    h = hashlib.sha256(BUILD_RECIPE.encode())
    for mod in MODULES:
        for name in ("go.mod", "go.sum"):
            p = HERE / mod / name
            h.update(f"\0{mod}/{name}\0".encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def recipe_hash(with_node: bool) -> str:
    """What a running cluster was started by: these scripts' text and the node switch. ``up`` restarts a
    cluster whose recipe differs instead of reusing one started with other flags or components."""
    h = hashlib.sha256(f"node={with_node}".encode())
    for f in recipe_files():
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def recipe_files() -> list[Path]:
    """The scripts a running cluster's recipe hashes: this CLI and the modules that start and stop it (not the
    add-ons, which ``up`` starts on a running cluster)."""
    pkg = HERE / "localcluster"
    modules = sorted(p for p in pkg.rglob("*.py") if "addons" not in p.relative_to(pkg).parts)
    return [HERE / "cluster.py", *modules]


def expected_components(state: dict) -> tuple[str, ...]:
    return COMPONENTS + (node.NODE_COMPONENTS if state.get("node") else ())


def bin_dir() -> Path:
    return cache_dir() / f"bin-{pins_hash()}"


@contextlib.contextmanager
def flock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- build


def go_env() -> dict:
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN=os.environ.get("KUBEINFER_GOTOOLCHAIN", "local"),
        GOWORK="off",
        CGO_ENABLED="0",
        GOFLAGS="-modcacherw -mod=readonly -buildvcs=false",
    )
    return env


def go(args: list[str], mod: str, capture: bool = False) -> str:
    cmd = ["go", *args]
    log(f"({mod}) $ {' '.join(shlex.quote(a) for a in cmd)}")
    try:
        p = subprocess.run(
            cmd,
            cwd=HERE / mod,
            env=go_env(),
            stdout=subprocess.PIPE if capture else sys.stderr,
            stderr=sys.stderr,
            text=True,
        )
    except FileNotFoundError as e:
        raise ClusterError("`go` not found on PATH: it is needed to build the binaries") from e
    if p.returncode != 0:
        raise ClusterError(
            f"go {' '.join(args[:2])} failed in e2e/cluster/{mod} (exit {p.returncode}); see the output above"
        )
    return p.stdout if capture else ""


def module_info(mod: str, path: str) -> dict:
    """Version, commit and time of a pinned dependency, from the module cache."""
    d = json.loads(go(["mod", "download", "-json", path], mod, capture=True))
    if d.get("Error"):
        raise ClusterError(f"go mod download {path}: {d['Error']}")
    info = json.loads(Path(d["Info"]).read_text())
    return {
        "version": d["Version"],
        "dir": d["Dir"],
        "time": info.get("Time", "1970-01-01T00:00:00Z").replace(".000Z", "Z"),
        "commit": (info.get("Origin") or {}).get("Hash", ""),
    }


def build(out: Path) -> None:
    out.mkdir(parents=True)
    jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
    common = ["build", "-p", jobs, "-trimpath"]

    # Kubernetes: the four commands in one invocation so shared packages compile once.
    k8s = module_info("k8s", "k8s.io/kubernetes")
    v = k8s["version"]
    major, minor = v.lstrip("v").split(".")[:2]
    x = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        x += [
            f"-X {pkg}.gitVersion={v}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitCommit={k8s['commit']}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={k8s['time']}",
        ]
    go(
        [
            *common,
            "-tags",
            K8S_TAGS,
            "-ldflags",
            " ".join(["-s -w", *x]),
            "-o",
            str(out) + "/",
            *(f"k8s.io/kubernetes/cmd/{c}" for c in K8S_CMDS),
        ],
        "k8s",
    )

    # etcd: version is hard-coded in the module; stamp the commit only.
    etcd = module_info("etcd", "go.etcd.io/etcd/server/v3")
    sha = f" -X go.etcd.io/etcd/api/v3/version.GitSHA={etcd['commit'][:7]}" if etcd["commit"] else ""
    go([*common, "-ldflags", "-s -w" + sha, "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"], "etcd")

    # kwok + its default stages (node initialize/heartbeat, pod ready/complete/delete).
    kwok = module_info("kwok", "sigs.k8s.io/kwok")
    go([*common, "-ldflags", "-s -w", "-o", str(out / "kwok"), "sigs.k8s.io/kwok/cmd/kwok"], "kwok")
    stages = []
    for rel in KWOK_STAGES:
        text = (Path(kwok["dir"]) / rel).read_text().strip()
        stages.append(f"# from sigs.k8s.io/kwok@{kwok['version']}/{rel}\n" + text.removeprefix("---\n"))
    (out / "kwok-stages.yaml").write_text("\n---\n".join(stages) + "\n")

    # helm v3: version stamps as in helm's Makefile.
    helm = module_info("helm", "helm.sh/helm/v3")
    cg = module_info("helm", "k8s.io/client-go")["version"].lstrip("v").split(".")
    kmaj, kmin = str(int(cg[0]) + 1), cg[1]
    hx = [
        f"-X helm.sh/helm/v3/internal/version.version={helm['version']}",
        f"-X helm.sh/helm/v3/internal/version.gitCommit={helm['commit']}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={kmaj}",
        f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={kmin}",
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={kmaj}",
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={kmin}",
    ]
    go([*common, "-ldflags", " ".join(["-s -w", *hx]), "-o", str(out / "helm"), "helm.sh/helm/v3/cmd/helm"], "helm")

    # CoreDNS for the worker node (wrapper module: upstream's plugins, only those the Corefile uses).
    coredns = module_info("coredns", "github.com/coredns/coredns")
    cx = f"-X github.com/coredns/coredns/coremain.GitCommit={coredns['commit'][:7]}" if coredns["commit"] else ""
    go([*common, "-ldflags", f"-s -w {cx}".strip(), "-o", str(out / "coredns"), "."], "coredns")

    # The pod sandbox ("pause") binary: Kubernetes' own build/pause/linux/pause.c at the pinned version,
    # compiled as upstream's Makefile does (static, -Os); localcluster/node/pause_image.py makes the sandbox image.
    pause_tag = pause_version(Path(k8s["dir"]))
    cc = ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{pause_tag}-{v}"]
    src = Path(k8s["dir"]) / "build" / "pause" / "linux" / "pause.c"
    p = subprocess.run([*cc, "-o", str(out / "pause"), str(src)], capture_output=True, text=True)
    if p.returncode != 0:
        raise ClusterError(f"compiling {src} failed (gcc and libc6-dev are needed):\n{p.stderr}")
    subprocess.run(["strip", str(out / "pause")], check=False)
    (out / "pause.version").write_text(pause_tag + "\n")

    for b in BINARIES:
        if not (out / b).is_file():
            raise ClusterError(f"build finished but {out / b} is missing")
    (out / "VERSIONS").write_text(
        json.dumps(
            {
                "kubernetes": v,
                "etcd": etcd["version"],
                "kwok": kwok["version"],
                "helm": helm["version"],
                "coredns": coredns["version"],
                "pause": pause_tag,
            },
            indent=2,
        )
        + "\n"
    )


def pause_version(k8s_dir: Path) -> str:
    """The pause image tag Kubernetes' own Makefile builds at this version (``TAG ?= 3.10.1``)."""
    for line in (k8s_dir / "build" / "pause" / "Makefile").read_text().splitlines():
        if line.replace(" ", "").startswith("TAG?="):
            return line.split("=", 1)[1].strip()
    raise ClusterError("no TAG in build/pause/Makefile")


def ensure_built() -> tuple[Path, float, bool]:
    """Return (bin dir, seconds spent, built now?)."""
    t0 = time.monotonic()
    target = bin_dir()
    done = target / ".complete"
    if done.exists():
        return target, time.monotonic() - t0, False
    with flock(cache_dir() / ".build.lock"):
        if done.exists():  # someone else built it while we waited
            return target, time.monotonic() - t0, False
        log(f"building binaries into {target} (cold build of Kubernetes takes a while)")
        tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build(tmp)
            (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    dt = time.monotonic() - t0
    log(f"build took {dt:.0f}s")
    return target, dt, True


# --------------------------------------------------------------------------- processes


def spawn(cmd: list[str], log_path: Path, cwd: Path, banner: str, env: dict | None = None) -> tuple[int, str | None]:
    """Start a component detached (its own session), appending to its log after a dated ``banner`` line.
    Returns its pid and /proc start time: the pair that tells it apart later from whatever reuses the pid."""
    with open(log_path, "ab") as logf:
        logf.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {banner}\n".encode())
        logf.flush()
        p = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=cwd,
            env=env,
        )
    st = None
    while st is None and p.poll() is None:
        st = proc_starttime(p.pid)
    return p.pid, st


def proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # zombie: already dead
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks since boot


def alive(comp: dict) -> bool:
    return proc_starttime(comp["pid"]) == comp["starttime"]


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


#: ports this process has handed out (the component or server may not have bound its port yet)
_HANDED_OUT: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` ports free on 127.0.0.1 now, chosen BELOW the kernel's ephemeral range, never handed out
    twice by this process (the test suite's servers take theirs here too: tests/support/server.py).

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, which every outgoing
    connection on the machine also draws from: between choosing it and the component binding it,
    a client's connection (or a test server's ``bind(0)``) can take it, and the component dies with
    "address already in use" (seen in CI: kube-scheduler, while other tests ran). Below the range
    only an explicit bind can collide, and ``up`` retries on that (see cmd_up); NodePorts are avoided too."""
    low = 10000
    high = max(low + 1000, min(30000, _ephemeral_range()[0]))  # 30000-32767: Services' NodePort range
    rng = random.Random()
    chosen: list[int] = []
    while len(chosen) < n:
        port = rng.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        _HANDED_OUT.add(port)
    return chosen


def load_state(rd: Path) -> dict | None:
    try:
        return json.loads((rd / "state.json").read_text())
    except (OSError, ValueError):
        return None


def save_state(rd: Path, state: dict) -> None:
    tmp = rd / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.rename(rd / "state.json")


def addons():
    """The add-ons module (addons.py); it imports this module back under the name ``cluster``."""
    sys.modules.setdefault("cluster", sys.modules[__name__])
    import addons as mod

    return mod


def stop_components(rd: Path, state: dict) -> list[str]:
    stopped = addons().stop(rd, state) if state.get("addons") else []
    comps = state.get("components", {})
    node_info = state.get("node")
    for name in reversed(list(comps)):
        comp = comps[name]
        if name == "containerd" and node_info:
            # the kubelet is gone by now; stop the pods while containerd can still do it
            n = containerd.kill_pods(configs.paths(rd, lifecycle.net_of(node_info)))
            if n:
                stopped.append(f"{n} pod container(s)")
        if not alive(comp):
            continue
        os.kill(comp["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 20
        while alive(comp) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(comp):
            log(f"{name} (pid {comp['pid']}) ignored SIGTERM; sending SIGKILL")
            os.kill(comp["pid"], signal.SIGKILL)
            while alive(comp):
                time.sleep(0.1)
        stopped.append(f"{name}({comp['pid']})")
    if node_info:
        lifecycle.cleanup(rd, node_info)
    for name in comps:
        with contextlib.suppress(OSError):
            (rd / "pids" / f"{name}.pid").unlink()
    with contextlib.suppress(OSError):
        (rd / "state.json").unlink()
    return stopped


# --------------------------------------------------------------------------- PKI / API


def openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed:\n{p.stdout}{p.stderr}")


def make_pki(
    pki: Path, api_ips: tuple[str, ...] = ("127.0.0.1",), service_ip: str = SERVICE_IP, kubelet_ip: str = ""
) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    o = lambda *a: openssl(*a, cwd=pki)  # noqa: E731
    for ca, cn in (("ca", "kubeinfer-local-ca"), ("front-proxy-ca", "kubeinfer-front-proxy-ca")):
        o(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.crt",
            "-days",
            "3650",
            "-subj",
            f"/CN={cn}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )
    certs = {
        "apiserver": (
            "ca",
            "/CN=kube-apiserver",
            "subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            + "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,"
            + "".join(f"IP:{ip}," for ip in api_ips)
            + f"IP:{service_ip}\nextendedKeyUsage=serverAuth\n",
        ),
        "admin": ("ca", "/O=system:masters/CN=kubeinfer-admin", "extendedKeyUsage=clientAuth\n"),
        # client cert the apiserver uses towards aggregated API servers (request-header auth)
        "front-proxy-client": ("front-proxy-ca", "/CN=front-proxy-client", "extendedKeyUsage=clientAuth\n"),
    }
    if kubelet_ip:  # the real node's kubelet serving certificate (the apiserver verifies it for logs/exec)
        certs["kubelet"] = (
            "ca",
            f"/O=system:nodes/CN=system:node:{node.NODE_NAME}",
            f"subjectAltName=DNS:{node.NODE_NAME},IP:{kubelet_ip}\nextendedKeyUsage=serverAuth\n",
        )
    for name, (ca, subj, ext) in certs.items():
        (pki / f"{name}.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n" + ext
        )
        o("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj)
        o(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            f"{ca}.crt",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "3650",
            "-sha256",
            "-extfile",
            f"{name}.ext",
        )
    o("genrsa", "-out", "sa.key", "2048")
    o("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    for k in pki.glob("*.key"):
        k.chmod(0o600)


def write_kubeconfig(path: Path, pki: Path, server: str) -> None:
    b64 = lambda f: base64.b64encode((pki / f).read_bytes()).decode()  # noqa: E731
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: kubeinfer-local
  cluster:
    server: {server}
    certificate-authority-data: {b64("ca.crt")}
users:
- name: kubeinfer-admin
  user:
    client-certificate-data: {b64("admin.crt")}
    client-key-data: {b64("admin.key")}
contexts:
- name: kubeinfer-local
  context:
    cluster: kubeinfer-local
    user: kubeinfer-admin
current-context: kubeinfer-local
""")
    path.chmod(0o600)


class Api:
    def __init__(self, server: str, pki: Path):
        self.server = server
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as e:
            return 0, str(e)

    def get_json(self, path: str) -> dict | None:
        code, text = self.call("GET", path)
        return json.loads(text) if code == 200 else None


def http_ok(url: str, insecure: bool = True) -> bool:
    ctx = ssl._create_unverified_context() if insecure else None  # self-signed serving certs of KCM/scheduler
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=3) as r:
            return r.status == 200
    except (OSError, ssl.SSLError, urllib.error.URLError):
        return False


def healthy(state: dict, patience: float = 30) -> bool:
    """All recorded processes alive and /readyz ok. A loaded machine can make the apiserver
    slow, so with every process alive keep asking for up to ``patience`` seconds before
    declaring the cluster broken (``up`` would then restart it under its users' feet)."""
    comps = state.get("components", {})
    if set(comps) != set(expected_components(state)):
        return False
    api = Api(state["server"], Path(state["pki"]))
    deadline = time.monotonic() + patience
    while all(alive(c) for c in comps.values()):
        code, text = api.call("GET", "/readyz", timeout=10)
        if code == 200 and text.strip() == "ok":
            return True
        if time.monotonic() > deadline:
            log(f"apiserver {state['server']} /readyz: HTTP {code}: {text.strip()[:500]}")
            return False
        time.sleep(1)
    return False


# --------------------------------------------------------------------------- up


def start(rd: Path, bins: Path, timeout: float, with_node: bool) -> dict:
    for sub in ("data", "pki", "pids"):
        shutil.rmtree(rd / sub, ignore_errors=True)
    (rd / "logs").mkdir(parents=True, exist_ok=True)
    (rd / "pids").mkdir(parents=True, exist_ok=True)
    pki = rd / "pki"
    net = None
    api_ip, service_cidr, service_ip = "127.0.0.1", SERVICE_CIDR, SERVICE_IP
    if with_node:
        # the node's network namespace comes first: the apiserver listens on the host end of its veth
        net = network.choose_net(rd)
        network.setup_network(net)
        api_ip, service_cidr, service_ip = net.host_ip, net.service_cidr, net.service_ip
    make_pki(pki, api_ips=(api_ip,), service_ip=service_ip, kubelet_ip=net.node_ip if net else "")
    (etcd_port, peer_port, api_port, kcm_port, sched_port) = free_ports(5)
    server = f"https://{api_ip}:{api_port}"
    kubeconfig = rd / "kubeconfig"
    write_kubeconfig(kubeconfig, pki, server)
    state = {
        "bin_dir": str(bins),
        "run_dir": str(rd),
        "kubeconfig": str(kubeconfig),
        "server": server,
        "pki": str(pki),
        "recipe": recipe_hash(with_node),
        "service_cidr": service_cidr,
        "ports": {
            "etcd": etcd_port,
            "etcd-peer": peer_port,
            "kube-apiserver": api_port,
            "kube-controller-manager": kcm_port,
            "kube-scheduler": sched_port,
        },
        "components": {},
    }
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    kc = str(kubeconfig)
    cmds = {
        "etcd": [
            "--name=kubeinfer",
            f"--data-dir={rd / 'data' / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kubeinfer={peer_url}",
            "--unsafe-no-fsync",
        ],
        "kube-apiserver": [
            f"--etcd-servers={etcd_url}",
            f"--bind-address={api_ip}",
            f"--advertise-address={api_ip}",
            f"--secure-port={api_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={service_cidr}",
            "--authorization-mode=RBAC",
            "--enable-admission-plugins=ExtendedResourceToleration",
            # logs/exec/port-forward: dial the kubelet by IP, authenticate as admin, verify its serving cert
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            *([f"--kubelet-certificate-authority={pki / 'ca.crt'}"] if net else []),
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        ],
        "kube-controller-manager": [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--controllers=*",
            "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={service_cidr}",
        ],
        "kube-scheduler": [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={sched_port}",
        ],
        "kwok": [
            f"--kubeconfig={kc}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--config={bins / 'kwok-stages.yaml'}",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
        ],
    }
    argv = {name: [str(bins / name), *flags] for name, flags in cmds.items()}
    node_paths: dict = {}
    if net:
        node_paths = configs.write_configs(rd, net, pki, bins, kubeconfig)
        argv.update(configs.commands(net, node_paths, bins))
        state["node"] = lifecycle.describe(net, node_paths)  # from here on, a failed start cleans the node up too
        save_state(rd, state)
    api = Api(server, pki)
    deadline = time.monotonic() + timeout

    def launch(name: str) -> None:
        pid, st = spawn(argv[name], rd / "logs" / f"{name}.log", rd, f"starting {name}")
        state["components"][name] = {
            "pid": pid,
            "starttime": st,
            "log": str(rd / "logs" / f"{name}.log"),
            "cmd": argv[name],
        }
        (rd / "pids" / f"{name}.pid").write_text(f"{pid}\n")
        save_state(rd, state)

    def wait(what: str, check, names: tuple[str, ...]) -> None:
        while True:
            for n in names:
                if not alive(state["components"][n]):
                    raise ClusterError(
                        f"{n} exited while waiting for {what}; last lines of "
                        f"{state['components'][n]['log']}:\n{tail(Path(state['components'][n]['log']))}"
                    )
            try:
                if check():
                    return
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {n}: {state['components'][n]['log']}\n{tail(Path(state['components'][n]['log']), 25)}"
                    for n in names
                )
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
            time.sleep(0.25)

    try:
        launch("etcd")
        wait("etcd /health", lambda: http_ok(etcd_url + "/health", insecure=False), ("etcd",))
        launch("kube-apiserver")
        wait("kube-apiserver /readyz", lambda: api.call("GET", "/readyz")[0] == 200, ("etcd", "kube-apiserver"))
        launch("kube-controller-manager")
        launch("kube-scheduler")
        launch("kwok")
        all_names = tuple(COMPONENTS)
        wait("kube-controller-manager /healthz", lambda: http_ok(f"https://127.0.0.1:{kcm_port}/healthz"), all_names)
        wait("kube-scheduler /healthz", lambda: http_ok(f"https://127.0.0.1:{sched_port}/healthz"), all_names)
        kwok_node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "nvidia.com/gpu.present": "true",
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "spec": {"taints": [GPU_TAINT]} if net else {},
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            },
        }
        code, text = api.call("POST", "/api/v1/nodes", kwok_node)
        if code not in (201, 409):
            raise ClusterError(f"creating node {NODE_NAME} failed: HTTP {code}: {text}")

        wait(f"node {NODE_NAME} Ready without not-ready taint", lambda: node_ready(api, NODE_NAME), all_names)
        # Pods need the namespace's default ServiceAccount (ServiceAccount admission).
        wait(
            "ServiceAccount default/default",
            lambda: api.get_json("/api/v1/namespaces/default/serviceaccounts/default") is not None,
            all_names,
        )
        if net:
            start_node(net, node_paths, bins, api, launch, wait, state, rd)
    except BaseException:
        log("start failed; stopping the processes started so far")
        stop_components(rd, state)
        raise
    state["started_at"] = time.time()
    save_state(rd, state)
    return state


def node_ready(api: Api, name: str) -> bool:
    n = api.get_json(f"/api/v1/nodes/{name}")
    if not n:
        return False
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
    tainted = any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints", []))
    return ready and not tainted


def start_node(net, paths: dict, bins: Path, api: Api, launch, wait, state: dict, rd: Path) -> None:
    """containerd (+ the pause image), kubelet, kube-proxy, CoreDNS; then the default StorageClass."""
    cgroups.make_cgroup_root(net)
    everything = tuple(COMPONENTS)
    containerd_log = rd / "logs" / "containerd.log"
    offset = containerd_log.stat().st_size if containerd_log.exists() else 0
    launch("containerd")
    everything += ("containerd",)
    wait(
        "containerd and its CRI service",
        lambda: containerd.containerd_ready(paths) and containerd.cri_serving(containerd_log, offset),
        everything,
    )
    pause = containerd.ensure_pause_image(paths, bins)
    log(f"containerd up; sandbox image {pause}")
    everything += ("kubelet",)
    for attempt in range(1, 4):
        launch("kubelet")
        try:
            wait(f"node {node.NODE_NAME} Ready", lambda: node_ready(api, node.NODE_NAME), everything)
            break
        except ClusterError as exc:
            if attempt == 3 or containerd.CRI_NOT_INITIALIZED not in str(exc):
                raise
            log(f"the kubelet reached containerd's CRI service before it was ready ({attempt}); starting it again")
            time.sleep(1)
    launch("kube-proxy")
    everything += ("kube-proxy",)
    wait("kube-proxy /healthz", lambda: http_ok(f"http://{net.node_ip}:10256/healthz"), everything)
    launch("coredns")
    everything += ("coredns",)
    wait("CoreDNS /ready", lambda: http_ok(f"http://{net.node_ip}:8181/ready"), everything)
    made = storage.ensure_storage(api, paths)
    log(
        f"node {node.NODE_NAME} Ready ({net.node_ip}, pods {net.pod_cidr}, Services {net.service_cidr}); "
        f"{made} new PersistentVolume(s) in the pool"
    )


def exports(state: dict) -> str:
    return (
        f'export KUBECONFIG={shlex.quote(state["kubeconfig"])}\nexport PATH={shlex.quote(state["bin_dir"])}:"$PATH"\n'
    )


def describe(state: dict, started: bool, build_s: float = 0.0, start_s: float = 0.0) -> dict:
    return {
        "kubeconfig": state["kubeconfig"],
        "bin_dir": state["bin_dir"],
        "run_dir": state["run_dir"],
        "server": state["server"],
        "started": started,
        "build_seconds": round(build_s, 1),
        "start_seconds": round(start_s, 1),
        "ports": state["ports"],
        "pids": {n: c["pid"] for n, c in state["components"].items()},
        "addons": addons().describe(state),
        "service_cidr": state.get("service_cidr", SERVICE_CIDR),
        "node": state.get("node"),
    }


def live_holders(rd: Path) -> list[int]:
    """PIDs registered with ``up --hold`` that are still alive (stale files are removed)."""
    live = []
    for f in (rd / "holders").glob("*"):
        try:
            pid, st = int(f.name), f.read_text().strip()
        except (OSError, ValueError):
            continue
        if proc_starttime(pid) == st:
            live.append(pid)
        else:
            f.unlink(missing_ok=True)
    return sorted(live)


def add_holder(rd: Path, pid: int) -> None:
    st = proc_starttime(pid)
    if st is None:
        raise ClusterError(f"--hold {pid}: no such process")
    (rd / "holders").mkdir(exist_ok=True)
    (rd / "holders" / str(pid)).write_text(st + "\n")


def cmd_up(args) -> int:
    bins, build_s, built = ensure_built()
    if not built:
        log(f"binaries: {bins} (cached, {build_s:.1f}s)")
    rd = run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    with_node = node.enabled()
    if with_node:
        node.ensure_packages()
    with flock(rd / ".lock"):
        state = load_state(rd)
        recipe = recipe_hash(with_node)
        if state and state.get("recipe") != recipe:
            stopped = stop_components(rd, state)
            log(
                f"the cluster running in {rd} was started by another recipe (cluster.py, localcluster/ or "
                f"KUBEINFER_CLUSTER_NODE differ); stopped {stopped or 'nothing'} to restart it"
            )
            state = None
        if state and state.get("bin_dir") == str(bins) and healthy(state):
            log(f"reusing running cluster at {state['server']} (run folder {rd})")
            if args.hold is None and state.get("managed"):
                state["managed"] = False  # adopted by a person: `release` must not stop it any more
                save_state(rd, state)
            out = describe(state, started=False, build_s=build_s)
        else:
            if state:
                stopped = stop_components(rd, state)
                log(f"previous cluster in {rd} was not healthy or used other binaries; stopped {stopped or 'nothing'}")
            t0 = time.monotonic()
            timeout = float(os.environ.get("KUBEINFER_CLUSTER_TIMEOUT", "180"))
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    state = start(rd, bins, timeout, with_node)
                    break
                except ClusterError as e:
                    if "address already in use" not in str(e) or attempt == START_ATTEMPTS:
                        raise
                    log(f"a port was taken before its component bound it; starting again ({attempt}/{START_ATTEMPTS})")
            state["managed"] = args.hold is not None
            save_state(rd, state)
            start_s = time.monotonic() - t0
            log(f"cluster started in {start_s:.1f}s at {state['server']} (logs and PIDs in {rd})")
            out = describe(state, started=True, build_s=build_s, start_s=start_s)
        names = addons().selected(args.addons)
        if names:
            secs = addons().start(rd, state, names, float(os.environ.get("KUBEINFER_CLUSTER_TIMEOUT", "180")))
            out = {**describe(state, out["started"], build_s, out["start_seconds"]), "addons_seconds": round(secs, 1)}
        if args.hold is not None:
            add_holder(rd, args.hold)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        log('to use it: eval "$(e2e/cluster/env)"')
        sys.stdout.write(exports(state))
    return 0


def stop_and_clean(rd: Path, state: dict) -> None:
    stopped = stop_components(rd, state)
    shutil.rmtree(rd / "data", ignore_errors=True)
    shutil.rmtree(rd / "holders", ignore_errors=True)
    what = ", ".join(stopped) if stopped else "nothing (processes were already gone)"
    log(f"stopped {what}; logs kept in {rd / 'logs'}")


def cmd_down(args) -> int:
    rd = run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    with flock(rd / ".lock"):
        state = load_state(rd)
        if not state:
            log(f"no cluster recorded in {rd}")
            return 0
        stop_and_clean(rd, state)
    return 0


def cmd_release(args) -> int:
    """Drop a holder; stop the cluster if it was started with --hold and nobody holds it now."""
    rd = run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    with flock(rd / ".lock"):
        (rd / "holders" / str(args.hold)).unlink(missing_ok=True)
        state = load_state(rd)
        if not state:
            log(f"no cluster recorded in {rd}")
            return 0
        others = live_holders(rd)
        if others:
            log(f"cluster still held by pid(s) {others}; leaving it running")
        elif not state.get("managed"):
            log("cluster was started or adopted by `up` without --hold; leaving it running")
        else:
            stop_and_clean(rd, state)
    return 0


def cmd_env(args) -> int:
    rd = run_dir()
    state = load_state(rd)
    if not state or not healthy(state):
        log(f"no running cluster in {rd}; start one with e2e/cluster/up")
        return 1
    if args.json:
        print(json.dumps(describe(state, started=False), indent=2))
    else:
        sys.stdout.write(exports(state))
    return 0


def cmd_restart(args) -> int:
    """Stop one component, keep it down ``--down-seconds``, start it again with the same flags.

    For fault drills (an apiserver restart in the middle of a reconcile). Refused on the shared
    default run folder, where it would disturb other sessions: set KUBEINFER_CLUSTER_RUN.
    """
    if not os.environ.get("KUBEINFER_CLUSTER_RUN") and not args.shared:
        raise ClusterError("restart needs KUBEINFER_CLUSTER_RUN (the default run folder is shared)")
    rd = run_dir()
    with flock(rd / ".lock"):
        state = load_state(rd)
        if not state or args.component not in state.get("components", {}):
            raise ClusterError(f"no {args.component} recorded in {rd}")
        comp = state["components"][args.component]
        if alive(comp):
            os.kill(comp["pid"], signal.SIGTERM)
            deadline = time.monotonic() + 20
            while alive(comp) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(comp):
                os.kill(comp["pid"], signal.SIGKILL)
                while alive(comp):
                    time.sleep(0.05)
        log(f"stopped {args.component} (pid {comp['pid']})")
        time.sleep(args.down_seconds)
        pid, st = spawn(comp["cmd"], Path(comp["log"]), rd, "restarting")
        comp.update(pid=pid, starttime=st)
        (rd / "pids" / f"{args.component}.pid").write_text(f"{pid}\n")
        save_state(rd, state)
        if args.component == "kube-apiserver":
            api = Api(state["server"], Path(state["pki"]))
            deadline = time.monotonic() + 120
            while True:
                if not alive(comp):
                    raise ClusterError(f"kube-apiserver exited after restart:\n{tail(Path(comp['log']))}")
                try:
                    if api.call("GET", "/readyz")[0] == 200:
                        break
                except (OSError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError("kube-apiserver not ready 120s after restart")
                time.sleep(0.2)
        log(f"restarted {args.component} (pid {pid})")
    return 0


def cmd_build(args) -> int:
    bins, secs, built = ensure_built()
    log(f"binaries in {bins} ({'built' if built else 'cached'}, {secs:.1f}s)")
    t0 = time.monotonic()
    extra = addons().ensure_built(addons().selected(args.addons))
    log(f"add-ons {', '.join(extra)} ready ({time.monotonic() - t0:.1f}s)")
    print(bins)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (
        ("up", cmd_up),
        ("down", cmd_down),
        ("env", cmd_env),
        ("build", cmd_build),
        ("release", cmd_release),
        ("restart", cmd_restart),
    ):
        p = sub.add_parser(name)
        if name in ("up", "env"):
            p.add_argument("--json", action="store_true", help="print a JSON document instead of export lines")
        if name in ("up", "build"):
            p.add_argument(
                "--addons",
                metavar="NAMES",
                help="comma-separated add-ons to build and start: prometheus, keda "
                "(default: $KUBEINFER_CLUSTER_ADDONS); see addons.py",
            )
        if name == "up":
            p.add_argument(
                "--hold",
                type=int,
                metavar="PID",
                help="register PID as a user of the cluster; a cluster started this way is stopped by "
                "`release` once no registered PID is alive (used by the pytest fixture)",
            )
        if name == "restart":
            p.add_argument("component", choices=COMPONENTS)
            p.add_argument("--down-seconds", type=float, default=0.0, help="how long it stays stopped")
            p.add_argument("--shared", action="store_true", help="allow it on the default (shared) run folder")
        if name == "release":
            p.add_argument("--hold", type=int, metavar="PID", required=True, help="the PID given to `up --hold`")
        p.set_defaults(fn=fn)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except ClusterError as e:
        log(f"ERROR: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
