"""Issue 23, part 3 end to end: a tenant's source.uri cannot make the operator fetch from inside the cluster.

Real control plane, a real operator process run as an admin would run it by default: no
``--allowed-network``, so only public addresses may be downloaded from. A tenant namespace names
this machine's loopback, the node's address as pods reach it (a file server listens there), the
node's own address (the kubelet's port), the API server's Service address, IPv6 loopback and the
cloud metadata endpoint. Each model gets ``Ready=False AddressRefused`` naming the address class
and the rule, the listening file servers see no request at all, and nothing is written.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import hostile
from tests.support.waiting import wait_for_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
POOL = "pool"


def model(name: str, uri: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {
            "server": POOL,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
            "versions": [{"version": 1, "source": {"uri": uri, "sha256": "0" * 64}}],
        },
    }


@pytest.fixture(scope="module")
def tenant(cluster: Any, node: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ns = f"e2e-egress-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    cluster.kubectl("create", "namespace", ns)
    root = tmp_path_factory.mktemp("egress-volume")
    (root / ns / POOL).mkdir(parents=True)
    log = tmp_path_factory.mktemp("egress-logs") / "operator.log"
    local = hostile.HostileServer()  # this machine's loopback
    at_node = hostile.HostileServer(host=node["host_ip"])  # the host as pods see it
    for s in (local, at_node):
        s.routes["/m.onnx"] = hostile.file(b"not for tenants")
    args = [
        sys.executable, "-m", "kubeinfer.operator",
        "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(root),
        "--namespace", ns,
        "--resync-seconds", "5",
    ]  # fmt: skip
    with open(log, "wb") as out:
        operator = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    pool = {
        "apiVersion": API,
        "kind": "InferenceServer",
        "metadata": {"name": POOL},
        "spec": {"image": "registry.example.com/kubeinfer-server:0.1.0", "repository": {"claimName": "m"}},
    }
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(pool))
    try:
        yield {"cluster": cluster, "ns": ns, "root": root, "servers": [local, at_node], "node": node,
               "operator": operator, "log": log}  # fmt: skip
    finally:
        cluster.kubectl("-n", ns, "delete", "inferencemodels,inferenceservers", "--all", "--wait=true",
                        "--timeout=60s", check=False)  # fmt: skip
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(30)
        except subprocess.TimeoutExpired:
            operator.kill()
        cluster.release_finalizers(ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for s in (local, at_node):
            s.close()


def test_cluster_and_host_addresses_are_refused_and_never_contacted(tenant: dict[str, Any]) -> None:
    cluster, ns = tenant["cluster"], tenant["ns"]
    local, at_node = tenant["servers"]
    api = json.loads(cluster.kubectl("-n", "default", "get", "service", "kubernetes", "-o", "json").stdout)
    cases = {
        "loopback": (f"{local.url}/m.onnx", "'127.0.0.1' is a loopback address"),
        "ipv6-loopback": (f"http://[::1]:{local.port}/m.onnx", "'::1' is a loopback address"),
        "node-host": (f"{at_node.url}/m.onnx", f"'{at_node.host}' is a private address"),
        "kubelet": (f"https://{tenant['node']['node_ip']}:10250/pods", "is a private address"),
        "apiserver": (f"https://{api['spec']['clusterIP']}/api/v1/secrets", "is a private address"),
        "metadata": ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "is a link-local address"),
        "metadata-v6": ("http://[fd00:ec2::254]/latest/meta-data/", "is a private address"),
    }
    items = [model(name, uri) for name, (uri, _) in cases.items()]
    cluster.kubectl(
        "-n", ns, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )

    def conditions() -> dict[str, dict[str, Any]] | None:
        listed = json.loads(cluster.kubectl("-n", ns, "get", "inferencemodels", "-o", "json").stdout)["items"]
        out = {}
        for m in listed:
            ready = next((c for c in (m.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})
            out[m["metadata"]["name"]] = ready
        return (
            out if all(c.get("reason") == "AddressRefused" for c in out.values()) and len(out) == len(cases) else None
        )

    try:
        seen = wait_for_cluster("every model refused by the address rules", conditions, 90)
    except BaseException:
        print(tenant["log"].read_text(errors="replace")[-6000:])
        raise
    for name, (_, text) in cases.items():
        message = seen[name]["message"]
        print(f"{name}: {message}")
        assert seen[name]["status"] == "False" and text in message, (name, message)
        assert "the operator downloads only from public addresses" in message
        assert "artifacts.allowedNetworks" in message  # what an admin can do about it
        assert not re.search("[0-9a-f]{64}", message)
    assert local.seen.requests == [] and at_node.seen.requests == []  # not one request reached them
    assert [p.name for p in (tenant["root"] / ns / POOL).iterdir()] == []  # nothing written, no staging left
    assert tenant["operator"].poll() is None
