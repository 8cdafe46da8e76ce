"""The local cluster's real worker node: containerd + runc, CNI bridge, kubelet, kube-proxy and CoreDNS.

Everything the node owns lives in one network namespace per run folder (``kubeinfer-<rid>``, joined
to the host by a veth pair), so two clusters on one machine (two run folders) never share a bridge,
iptables rules, kubelet ports or a CNI network, and ``down`` removes all of it by deleting the
namespace. The processes run in the host's mount namespace (``nsenter --net`` only), so the kubelet's
volume mounts are seen by containerd and runc. Per run folder ``<rd>``:

  <rd>/node/containerd   containerd root (images and snapshots; kept across down/up as a cache)
  <rd>/node/kubelet      kubelet root dir (pod volumes), <rd>/node/pod-logs, <rd>/node/cni (CNI config
                         and host-local IPAM state), <rd>/node/*.yaml|toml (configs), <rd>/volumes (PVs)
  /run/kubeinfer-<rid>   containerd's sockets and state (short paths: unix sockets have a 108-byte limit)
  cgroup /kubeinfer-<rid>  the kubelet's cgroupRoot in every cgroup hierarchy

Addresses come from a slot (0-249) per run folder: veth 172.28.<slot>.0/24 (host .1, node .2), pods
10.245.<slot>.0/24 on the bridge (gateway .1, where CoreDNS answers), Services 10.96.<slot>.0/24. The
host routes the pod and Service ranges to the node, so tests reach ClusterIPs and pod IPs directly;
the kube-apiserver listens on the host end of the veth, which pods reach through the
``kubernetes`` Service. Only the Python standard library and the tools of ``system-packages``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "kubeinfer-node-0"
PAUSE_REPO = "localhost/kubeinfer/pause"
LINK_NET, POD_NET, SERVICE_NET = "172.28", "10.245", "10.96"
SLOTS = 250
STORAGE_CLASS = "local-hostpath"
#: Available PersistentVolumes ``up`` keeps in the pool (each claim binds one; released ones are retained).
PV_POOL = 10
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns")


class NodeError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[kubeinfer-cluster] {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def enabled() -> bool:
    """A real node is started unless KUBEINFER_CLUSTER_NODE=0; it needs root (namespaces, mounts, iptables)."""
    want = os.environ.get("KUBEINFER_CLUSTER_NODE", "auto")
    if want == "0":
        return False
    if os.geteuid() != 0:
        if want == "1":
            raise NodeError("KUBEINFER_CLUSTER_NODE=1 needs root (network namespace, mounts, iptables, cgroups)")
        log("not root: starting the control plane with the kwok GPU node only (no real worker node)")
        return False
    return True


def ensure_packages() -> None:
    """containerd, runc, CNI plugins, iptables, ... from Debian (``system-packages``; a no-op when present)."""
    p = subprocess.run([str(Path(__file__).resolve().parent / "system-packages")], stdout=sys.stderr)
    if p.returncode != 0:
        raise NodeError("e2e/cluster/system-packages failed (see above)")


# --------------------------------------------------------------------------- addressing


@dataclass(frozen=True)
class Net:
    rid: str
    slot: int

    @property
    def netns(self) -> str:
        return f"kubeinfer-{self.rid}"

    @property
    def host_if(self) -> str:
        return f"kih{self.rid}"  # 11 characters (IFNAMSIZ is 16)

    @property
    def host_ip(self) -> str:
        return f"{LINK_NET}.{self.slot}.1"

    @property
    def node_ip(self) -> str:
        return f"{LINK_NET}.{self.slot}.2"

    @property
    def pod_cidr(self) -> str:
        return f"{POD_NET}.{self.slot}.0/24"

    @property
    def dns_ip(self) -> str:
        return f"{POD_NET}.{self.slot}.1"  # the bridge's address (the pods' gateway)

    @property
    def service_cidr(self) -> str:
        return f"{SERVICE_NET}.{self.slot}.0/24"

    @property
    def service_ip(self) -> str:
        return f"{SERVICE_NET}.{self.slot}.1"

    @property
    def cgroup_root(self) -> str:
        return f"/kubeinfer-{self.rid}"

    @property
    def sock_dir(self) -> Path:
        return Path(f"/run/kubeinfer-{self.rid}")

    def ns_cmd(self, *argv: str) -> list[str]:
        """Run argv in the node's network namespace (host mount namespace)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


def run_id(rd: Path) -> str:
    return hashlib.sha256(str(rd.resolve()).encode()).hexdigest()[:8]


def _taken_slots(own: str) -> set[int]:
    """Slots whose addresses the host already uses (another run folder's node, or anything else)."""
    taken: set[int] = set()
    addrs = json.loads(sh("ip", "-j", "-4", "addr").stdout or "[]")
    routes = json.loads(sh("ip", "-j", "-4", "route").stdout or "[]")
    texts = [a.get("local", "") for i in addrs for a in i.get("addr_info", []) if i.get("ifname") != own]
    texts += [r.get("dst", "") for r in routes if r.get("dev") != own]
    for t in texts:
        for prefix in (LINK_NET, POD_NET, SERVICE_NET):
            if t.startswith(prefix + "."):
                with contextlib.suppress(ValueError, IndexError):
                    taken.add(int(t.split(".")[2]))
    return taken


def choose_net(rd: Path) -> Net:
    rid = run_id(rd)
    own = Net(rid, 0).host_if
    taken = _taken_slots(own)
    first = int(rid, 16) % SLOTS
    for i in range(SLOTS):
        slot = (first + i) % SLOTS
        if slot not in taken:
            return Net(rid, slot)
    raise NodeError(f"no free address slot in {LINK_NET}/{POD_NET}/{SERVICE_NET}.<0-{SLOTS - 1}>")


# --------------------------------------------------------------------------- network namespace


def setup_network(net: Net) -> None:
    teardown_network(net)  # leftovers of a crashed run of this same run folder
    sh("ip", "netns", "add", net.netns)
    sh("ip", "link", "add", net.host_if, "type", "veth", "peer", "name", "eth0", "netns", net.netns)
    sh("ip", "addr", "add", f"{net.host_ip}/24", "dev", net.host_if)
    sh("ip", "link", "set", net.host_if, "up")
    n = ["ip", "-n", net.netns]
    sh(*n, "link", "set", "lo", "up")
    sh(*n, "addr", "add", f"{net.node_ip}/24", "dev", "eth0")
    sh(*n, "link", "set", "eth0", "up")
    sh(*n, "route", "add", "default", "via", net.host_ip)
    sh(*net.ns_cmd("sysctl", "-qw", "net.ipv4.ip_forward=1"))
    # kube-proxy's rules must see bridged pod-to-pod traffic (per namespace on recent kernels).
    sh(*net.ns_cmd("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"), check=False)
    for cidr in (net.pod_cidr, net.service_cidr):
        sh("ip", "route", "replace", cidr, "via", net.node_ip, "dev", net.host_if)


def teardown_network(net: Net) -> None:
    if Path(f"/run/netns/{net.netns}").exists():
        sh("ip", "netns", "delete", net.netns, check=False)  # takes the bridge, veth and iptables with it
    sh("ip", "link", "delete", net.host_if, check=False)


# --------------------------------------------------------------------------- cgroups


def cgroup_mounts() -> list[Path]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            out.append(Path(fields[1]))
    return out


def make_cgroup_root(net: Net) -> None:
    for mnt in cgroup_mounts():
        d = mnt / net.cgroup_root.lstrip("/")
        d.mkdir(exist_ok=True)
        if (mnt / "cpuset.cpus").exists():  # cgroup v1 cpuset: a child starts empty
            for f in ("cpuset.cpus", "cpuset.mems"):
                with contextlib.suppress(OSError):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((mnt / f).read_text())


def remove_cgroup_root(net: Net) -> list[int]:
    """Kill whatever still runs under the cgroup root and remove it, leaves first. Returns killed PIDs."""
    killed: list[int] = []
    for mnt in cgroup_mounts():
        root = mnt / net.cgroup_root.lstrip("/")
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                for pid in map(int, procs.read_text().split()):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
    deadline = time.monotonic() + 10
    for mnt in cgroup_mounts():
        root = mnt / net.cgroup_root.lstrip("/")
        if not root.is_dir():
            continue
        dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, root]:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log(f"could not remove cgroup {d} (processes still inside?)")
                        break
                    time.sleep(0.1)
    return killed


# --------------------------------------------------------------------------- pause image


def pause_image(bins: Path) -> tuple[str, bytes]:
    """An OCI image archive of Kubernetes' pause binary (built from the pinned k8s module by ``build``).

    One uncompressed layer with /pause, entrypoint /pause, user 65535 -- what build/pause/Dockerfile
    makes; assembled here because it needs nothing but the binary. Deterministic bytes (no timestamps),
    so the image digest only changes with the binary."""
    tag = (bins / "pause.version").read_text().strip()
    ref = f"{PAUSE_REPO}:{tag}"

    def tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for name, (data, mode) in files.items():
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.mtime, ti.uid, ti.gid = len(data), mode, 0, 0, 0
                tf.addfile(ti, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_bytes({"pause": ((bins / "pause").read_bytes(), 0o755)})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": f"kubeinfer e2e/cluster: Kubernetes build/pause/linux/pause.c ({tag})"}],
        },
        sort_keys=True,
    ).encode()
    blobs = {}

    def desc(media: str, data: bytes, **extra) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data), **extra}

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": desc("application/vnd.oci.image.config.v1+json", config),
            "layers": [desc("application/vnd.oci.image.layer.v1.tar", layer)],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                desc(
                    "application/vnd.oci.image.manifest.v1+json",
                    manifest,
                    platform={"architecture": "amd64", "os": "linux"},
                    annotations={"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
                )
            ],
        },
        sort_keys=True,
    ).encode()
    files = {"oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644), "index.json": (index, 0o644)}
    files.update({f"blobs/sha256/{d}": (data, 0o644) for d, data in blobs.items()})
    return ref, tar_bytes(files)


# --------------------------------------------------------------------------- configuration


def paths(rd: Path, net: Net) -> dict[str, str]:
    nd = rd / "node"
    return {
        "node_dir": str(nd),
        "containerd_root": str(nd / "containerd"),
        "containerd_state": str(net.sock_dir / "containerd"),
        "containerd_socket": str(net.sock_dir / "containerd.sock"),
        "containerd_config": str(nd / "containerd.toml"),
        "cni_conf_dir": str(nd / "cni" / "net.d"),
        "cni_ipam_dir": str(nd / "cni" / "ipam"),
        "kubelet_root": str(nd / "kubelet"),
        "kubelet_config": str(nd / "kubelet.yaml"),
        "pod_logs": str(nd / "pod-logs"),
        "kube_proxy_config": str(nd / "kube-proxy.yaml"),
        "corefile": str(nd / "Corefile"),
        "volumes": str(rd / "volumes"),
    }


def write_configs(rd: Path, net: Net, pki: Path, bins: Path, kubeconfig: Path) -> dict:
    p = paths(rd, net)
    p["kubeconfig"] = str(kubeconfig)  # the admin kubeconfig (no Node authorizer here; see NOTES.md)
    for key in ("node_dir", "containerd_root", "cni_conf_dir", "cni_ipam_dir", "kubelet_root", "pod_logs", "volumes"):
        Path(p[key]).mkdir(parents=True, exist_ok=True)
    net.sock_dir.mkdir(parents=True, exist_ok=True)
    pause_ref = f"{PAUSE_REPO}:{(bins / 'pause.version').read_text().strip()}"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    Path(p["containerd_config"]).write_text(f"""# generated by e2e/cluster/node.py
version = 2
root = "{p["containerd_root"]}"
state = "{p["containerd_state"]}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{p["containerd_socket"]}"
[ttrpc]
  address = "{p["containerd_socket"]}.ttrpc"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{p["containerd_root"]}/opt"

[{cri}]
  sandbox_image = "{pause_ref}"
  # lowering oom_score_adj (the kubelet asks -998 for sandboxes) needs CAP_SYS_RESOURCE, which these VMs lack
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{p["cni_conf_dir"]}"
    max_conf_num = 1
""")
    conflist = {
        "cniVersion": "0.4.0",
        "name": f"kubeinfer-{net.rid}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": net.pod_cidr, "gateway": net.dns_ip}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": p["cni_ipam_dir"],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (Path(p["cni_conf_dir"]) / "10-kubeinfer.conflist").write_text(json.dumps(conflist, indent=2) + "\n")
    Path(p["kubelet_config"]).write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "containerRuntimeEndpoint": f"unix://{p['containerd_socket']}",
                "cgroupDriver": "cgroupfs",  # no systemd as PID 1
                "cgroupRoot": net.cgroup_root,
                "failCgroupV1": False,  # the VMs mount cgroup v1 controllers
                "failSwapOn": False,
                "address": net.node_ip,
                "port": 10250,
                "readOnlyPort": 0,
                "healthzBindAddress": net.node_ip,
                "healthzPort": 10248,
                "tlsCertFile": str(pki / "kubelet.crt"),
                "tlsPrivateKeyFile": str(pki / "kubelet.key"),
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": True},
                    "x509": {"clientCAFile": str(pki / "ca.crt")},
                },
                "authorization": {"mode": "Webhook"},
                "clusterDomain": "cluster.local",
                "clusterDNS": [net.dns_ip],
                "oomScoreAdj": 0,  # the default -999 needs CAP_SYS_RESOURCE
                "podLogsDir": p["pod_logs"],
                "volumePluginDir": str(Path(p["kubelet_root"]) / "volume-plugins"),
                # local images only (no registry): never garbage-collect them; evict only when truly short
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "evictionHard": {
                    "memory.available": "200Mi",
                    "nodefs.available": "2%",
                    "imagefs.available": "2%",
                    "nodefs.inodesFree": "2%",
                },
                "serializeImagePulls": False,
                "rotateCertificates": False,
                "syncFrequency": "10s",
                "fileCheckFrequency": "10s",
                "nodeStatusUpdateFrequency": "5s",
                "shutdownGracePeriod": "0s",
            },
            indent=2,
        )
        + "\n"
    )
    Path(p["kube_proxy_config"]).write_text(
        json.dumps(
            {
                "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                "kind": "KubeProxyConfiguration",
                "clientConnection": {"kubeconfig": p["kubeconfig"]},
                "hostnameOverride": NODE_NAME,
                "mode": "iptables",
                "clusterCIDR": net.pod_cidr,
                "bindAddress": net.node_ip,
                "healthzBindAddress": f"{net.node_ip}:10256",
                "metricsBindAddress": f"{net.node_ip}:10249",
                "oomScoreAdj": 0,
                "conntrack": {"maxPerCore": 0},  # leave the host-wide conntrack table size alone
                "iptables": {"syncPeriod": "30s", "minSyncPeriod": "0s"},
            },
            indent=2,
        )
        + "\n"
    )
    Path(p["corefile"]).write_text(f""".:53 {{
    errors
    health {net.node_ip}:8080
    ready {net.node_ip}:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {p["kubeconfig"]}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loop
    loadbalance
}}
""")
    return p


def commands(net: Net, p: dict, bins: Path) -> dict[str, list[str]]:
    """argv of each node component (started by cluster.py's launcher, in the node's network namespace)."""
    return {
        "containerd": net.ns_cmd("containerd", "--config", p["containerd_config"]),
        "kubelet": net.ns_cmd(
            str(bins / "kubelet"),
            f"--config={p['kubelet_config']}",
            f"--kubeconfig={p['kubeconfig']}",
            f"--root-dir={p['kubelet_root']}",
            # cAdvisor's containerd factory (container stats, imagefs) dials this; its default is /run/containerd
            f"--containerd={p['containerd_socket']}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={net.node_ip}",
            "--node-labels=kubeinfer.io/node=real",
            "--v=1",
        ),
        "kube-proxy": net.ns_cmd(str(bins / "kube-proxy"), f"--config={p['kube_proxy_config']}", "--v=1"),
        "coredns": net.ns_cmd(str(bins / "coredns"), "-conf", p["corefile"]),
    }


# --------------------------------------------------------------------------- runtime helpers


def ctr(p: dict, *args: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    cmd = ["ctr", "--address", p["containerd_socket"], "--namespace", "k8s.io", *args]
    proc = subprocess.run(cmd, capture_output=True, input=input)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
    return proc


def containerd_ready(p: dict) -> bool:
    return Path(p["containerd_socket"]).exists() and ctr(p, "version", check=False).returncode == 0


#: what containerd's CRI service logs once it has recovered its state, right before it marks itself initialized
#: (containerd 2.x, internal/cri/server/service.go ``Run``). ``ctr version`` answers earlier: a kubelet started
#: in between fails "validate CRI v1 runtime API ... server is not initialized yet" and exits (seen once, when
#: recovering took 2 s instead of 20 ms).
CRI_SERVING = b'msg="Start streaming server"'

#: the kubelet's words when it reached the CRI service too early (it exits; starting it again is the cure)
CRI_NOT_INITIALIZED = "server is not initialized yet"


def cri_serving(log_path: Path, offset: int) -> bool:
    """containerd's CRI service logged that it serves, after byte ``offset`` of its log (this start)."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        return CRI_SERVING in f.read()


def ensure_pause_image(p: dict, bins: Path) -> str:
    ref, archive = pause_image(bins)
    if ref not in ctr(p, "images", "ls", "-q").stdout.decode().split():
        ctr(p, "images", "import", "-", input=archive)
    return ref


def kill_pods(p: dict) -> int:
    """Stop every container the node's containerd runs (called after the kubelet is gone)."""
    if not containerd_ready(p):
        return 0
    ids = ctr(p, "containers", "ls", "-q", check=False).stdout.decode().split()
    Path(p["node_dir"], "containers-at-stop").write_text("\n".join(ids) + "\n")
    tasks = ctr(p, "tasks", "ls", "-q", check=False).stdout.decode().split()
    for t in tasks:
        ctr(p, "tasks", "kill", "-s", "SIGKILL", t, check=False)
    deadline = time.monotonic() + 15
    for t in tasks:
        while ctr(p, "tasks", "delete", t, check=False).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    for c in ctr(p, "containers", "ls", "-q", check=False).stdout.decode().split():
        ctr(p, "containers", "delete", c, check=False)
    return len(tasks)


def _mounts_under(prefixes: list[str]) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].encode().decode("unicode_escape")
        if any(mp == pre or mp.startswith(pre.rstrip("/") + "/") for pre in prefixes):
            out.append(mp)
    return out


def cleanup(rd: Path, node: dict) -> None:
    """After every node process has stopped: free everything host-global the node used."""
    net = Net(node["rid"], node["slot"])
    p = paths(rd, net)
    # stray shims of this containerd (they outlive it by design) and anything left in its cgroups
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if (
                cmdline
                and cmdline[0].endswith(b"containerd-shim-runc-v2")
                and p["containerd_socket"].encode() in cmdline
            ):
                os.kill(int(proc.name), signal.SIGKILL)
    remove_cgroup_root(net)
    prefixes = [p["kubelet_root"], p["containerd_state"], p["containerd_root"], str(net.sock_dir)]
    for _ in range(3):
        mounts = _mounts_under(prefixes)
        if not mounts:
            break
        for mp in sorted(mounts, key=len, reverse=True):
            if sh("umount", mp, check=False).returncode != 0:
                sh("umount", "-l", mp, check=False)
    teardown_network(net)
    for link in Path("/var/log/containers").glob("*.log") if Path("/var/log/containers").is_dir() else []:
        with contextlib.suppress(OSError):
            if os.readlink(link).startswith(p["pod_logs"]):
                link.unlink()
    # libcni's result cache (a fixed host path): our network's entries and the loopback ones of our sandboxes
    stopped = Path(p["node_dir"], "containers-at-stop")
    ids = stopped.read_text().split() if stopped.exists() else []
    results = Path("/var/lib/cni/results")
    for f in results.glob("*") if results.is_dir() else []:
        if f.name.startswith(f"kubeinfer-{net.rid}-") or any(f"-{i}-" in f.name for i in ids):
            f.unlink(missing_ok=True)
    stopped.unlink(missing_ok=True)
    shutil.rmtree(net.sock_dir, ignore_errors=True)
    shutil.rmtree(p["kubelet_root"], ignore_errors=True)
    shutil.rmtree(p["cni_ipam_dir"], ignore_errors=True)
    shutil.rmtree(p["volumes"], ignore_errors=True)  # the PersistentVolume objects died with etcd


def ensure_storage(api, p: dict) -> int:
    """A default StorageClass of pre-made hostPath PersistentVolumes on the real node, topped up to PV_POOL
    Available ones (each claim binds one; Retain keeps a released volume's data). Returns PVs created."""
    sc = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }
    code, text = api.call("POST", "/apis/storage.k8s.io/v1/storageclasses", sc)
    if code not in (201, 409):
        raise NodeError(f"creating StorageClass {STORAGE_CLASS}: HTTP {code}: {text}")
    pvs = (api.get_json("/api/v1/persistentvolumes") or {}).get("items", [])
    available = [
        pv
        for pv in pvs
        if pv["spec"].get("storageClassName") == STORAGE_CLASS and (pv.get("status") or {}).get("phase") == "Available"
    ]
    created = 0
    for _ in range(PV_POOL - len(available)):
        name = f"local-{uuid.uuid4().hex[:8]}"
        folder = Path(p["volumes"]) / name
        folder.mkdir(parents=True)
        folder.chmod(0o777)  # any pod user may write (as local-path-provisioner does); fsGroup can't chown hostPath
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"kubeinfer.io/volume-pool": "local"}},
            "spec": {
                "capacity": {"storage": "1Ti"},  # nominal: hostPath does not enforce a size
                "accessModes": ["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORAGE_CLASS,
                "hostPath": {"path": str(folder), "type": "Directory"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                                ]
                            }
                        ]
                    }
                },
            },
        }
        code, text = api.call("POST", "/api/v1/persistentvolumes", pv)
        if code != 201:
            raise NodeError(f"creating PersistentVolume {name}: HTTP {code}: {text}")
        created += 1
    return created


def describe(net: Net, p: dict) -> dict:
    return {
        "name": NODE_NAME,
        "rid": net.rid,
        "slot": net.slot,
        "netns": net.netns,
        "node_ip": net.node_ip,
        "host_ip": net.host_ip,
        "pod_cidr": net.pod_cidr,
        "service_cidr": net.service_cidr,
        "dns_ip": net.dns_ip,
        "cgroup_root": net.cgroup_root,
        "storage_class": STORAGE_CLASS,
        **{k: p[k] for k in ("containerd_socket", "kubelet_root", "pod_logs", "volumes")},
    }


def net_of(node: dict) -> Net:
    return Net(node["rid"], node["slot"])
