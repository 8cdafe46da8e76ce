"""The node's network: its namespace joined to the host by a veth pair, and the address slot per run folder."""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..node import NodeError, sh

LINK_NET, POD_NET, SERVICE_NET = "172.28", "10.245", "10.96"
SLOTS = 250


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
