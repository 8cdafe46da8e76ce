"""The node's start (after the control plane), its clean-up after its processes stopped, and what ``state.json``
records of it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from ..apiclient import Api, http_ok, node_ready
from ..base import ClusterError, log
from ..node import NODE_NAME, cgroups, containerd, sh, storage
from ..node.cgroups import remove_cgroup_root
from ..node.configs import paths
from ..node.network import Net, teardown_network


def start_node(net: Net, paths: dict, bins: Path, api: Api, launcher, started: tuple[str, ...], rd: Path) -> None:
    """containerd (+ the pause image), kubelet, kube-proxy, CoreDNS, with ``launcher`` (supervisor.Launcher; the
    control plane's ``started`` components are watched too); then the default StorageClass."""
    launch, wait = launcher.launch, launcher.wait
    cgroups.make_cgroup_root(net)
    everything = started
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
            wait(f"node {NODE_NAME} Ready", lambda: node_ready(api, NODE_NAME), everything)
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
        f"node {NODE_NAME} Ready ({net.node_ip}, pods {net.pod_cidr}, Services {net.service_cidr}); "
        f"{made} new PersistentVolume(s) in the pool"
    )


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
        "storage_class": storage.STORAGE_CLASS,
        **{k: p[k] for k in ("containerd_socket", "kubelet_root", "pod_logs", "volumes")},
    }


def net_of(node: dict) -> Net:
    return Net(node["rid"], node["slot"])
