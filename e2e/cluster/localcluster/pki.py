"""The cluster's certificates and keys (openssl) and the admin kubeconfig that carries them."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

from .base import ClusterError
from .node import NODE_NAME


def openssl(*args: str, cwd: Path) -> None:
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed:\n{p.stdout}{p.stderr}")


def make_pki(pki: Path, api_ips: tuple[str, ...], service_ip: str, kubelet_ip: str = "") -> None:
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
            f"/O=system:nodes/CN=system:node:{NODE_NAME}",
            f"subjectAltName=DNS:{NODE_NAME},IP:{kubelet_ip}\nextendedKeyUsage=serverAuth\n",
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
