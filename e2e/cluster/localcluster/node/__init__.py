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

Modules: ``network`` (namespace, veth, address slots), ``cgroups`` (the kubelet's cgroup root),
``pause_image`` (the sandbox image's OCI archive), ``configs`` (containerd, CNI, kubelet, kube-proxy and
CoreDNS configuration, and their command lines), ``containerd`` (talking to the node's containerd),
``storage`` (the default StorageClass and its PersistentVolume pool), ``lifecycle`` (start and clean up).
"""

from __future__ import annotations

import os
import subprocess
import sys

from .. import base
from ..base import log

NODE_NAME = "kubeinfer-node-0"
PAUSE_REPO = "localhost/kubeinfer/pause"
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns")


class NodeError(RuntimeError):
    pass


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
    p = subprocess.run([str(base.CLUSTER_DIR / "system-packages")], stdout=sys.stderr)
    if p.returncode != 0:
        raise NodeError("e2e/cluster/system-packages failed (see above)")
