"""The control plane's components and their command lines: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with its one fake GPU node, on 127.0.0.1 (or the host end of the node's veth)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
NODE_NAME = "kwok-gpu-node-0"
#: GPU nodes carry this taint (as on GKE/AKS); the ExtendedResourceToleration admission plugin gives
#: every pod that asks for nvidia.com/gpu the toleration, so CPU-only pods land on the real node.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
POD_CIDR = "10.244.0.0/16"


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    def record(self) -> dict[str, int]:
        """As ``state.json`` keeps them."""
        return {
            "etcd": self.etcd,
            "etcd-peer": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
        }


def etcd_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.etcd}"


def commands(
    rd: Path, bins: Path, pki: Path, kubeconfig: Path, ports: Ports, api_ip: str, service_cidr: str, with_node: bool
) -> dict[str, list[str]]:
    """argv of each component (its binary from ``bins``); ``with_node``: the apiserver verifies the real node's
    kubelet serving certificate."""
    etcd = etcd_url(ports)
    peer_url = f"http://127.0.0.1:{ports.etcd_peer}"
    kc = str(kubeconfig)
    cmds = {
        "etcd": [
            "--name=kubeinfer",
            f"--data-dir={rd / 'data' / 'etcd'}",
            f"--listen-client-urls={etcd}",
            f"--advertise-client-urls={etcd}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kubeinfer={peer_url}",
            "--unsafe-no-fsync",
        ],
        "kube-apiserver": [
            f"--etcd-servers={etcd}",
            f"--bind-address={api_ip}",
            f"--advertise-address={api_ip}",
            f"--secure-port={ports.apiserver}",
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
            *([f"--kubelet-certificate-authority={pki / 'ca.crt'}"] if with_node else []),
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
            f"--secure-port={ports.controller_manager}",
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
            f"--secure-port={ports.scheduler}",
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
    return {name: [str(bins / name), *flags] for name, flags in cmds.items()}


def kwok_node(gpu_taint: bool) -> dict:
    """The fake GPU node kwok keeps Ready; tainted as cloud GPU nodes are when a real node takes the CPU pods."""
    return {
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
        "spec": {"taints": [GPU_TAINT]} if gpu_taint else {},
        "status": {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
        },
    }
