"""Issue 23 end to end: tenant namespaces apart by construction, on real pods of the real node.

The operator (a host process, as a platform team's in-cluster operator would be, with its own claim on a
hostPath volume of the node) provides each namespace with InferenceServers a claim that reaches only
``<volume>/<namespace>/``. Checked on real pods:

* a pod in A mounting A's claim sees A's folder and nothing else of the volume: not B's folder, not the
  volume's root, not the operator's staging; B's model file cannot be opened from it by any path;
* a server pool with ``spec.auth`` (token Secret) refuses HTTP and gRPC calls without the token, answers
  with it, and the operator's own index reads send it (its model becomes Ready);
* each pool gets a NetworkPolicy that lets in its own namespace, the operator and nothing else. The local
  cluster's ``bridge`` CNI does not enforce NetworkPolicies, so a pod in a third namespace is *not*
  stopped here; the test checks the policy the API server accepted instead (SECURITY.md says so).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support import processes
from tests.support.models import unary
from tests.support.waiting import wait_for_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
TOKEN = "tenant-a-token"
LISTING = """
import json, os, sys
seen = {"data": sorted(os.listdir("/data")), "parent": sorted(os.listdir("/data/.."))}
tried = {}
for path in sys.argv[1:]:
    try:
        open(path, "rb").read(1)
        tried[path] = "read"
    except OSError as exc:
        tried[path] = type(exc).__name__
seen["tried"] = tried
print(json.dumps(seen))
"""


@dataclass
class Tenants:
    cluster: Any
    images: dict
    ops: str
    a: str
    b: str
    c: str
    root: Path
    log: Path
    operator: subprocess.Popen[bytes]

    def kubectl(self, ns: str, *args: str, check: bool = True, input: str | None = None, timeout: float = 120):
        return self.cluster.kubectl("-n", ns, *args, check=check, input=input, timeout=timeout)

    def apply(self, ns: str, obj: dict[str, Any]) -> None:
        self.kubectl(ns, "apply", "-f", "-", input=json.dumps(obj))

    def get(self, ns: str, kind: str, name: str) -> dict[str, Any]:
        proc = self.kubectl(ns, "get", kind, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def condition(self, ns: str, kind: str, name: str, ctype: str) -> dict[str, Any]:
        conds = (self.get(ns, kind, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == ctype), {})

    def describe(self) -> str:
        out = [
            self.kubectl(ns, "get", "isrv,im,pvc,pods,netpol", "-o", "wide", check=False).stdout
            for ns in (self.a, self.b)
        ]
        return "\n".join(out) + "\n--- operator:\n" + self.log.read_text(errors="replace")[-6000:]

    def pool(self, ns: str, name: str, **spec: Any) -> None:
        self.apply(
            ns,
            {
                "apiVersion": API,
                "kind": "InferenceServer",
                "metadata": {"name": name},
                "spec": {
                    "image": self.images["server"],
                    "imagePullPolicy": "IfNotPresent",
                    "replicas": 1,
                    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                    "server": {"pollIntervalSeconds": 1},
                    "probes": {"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1}},
                    **spec,
                },
            },
        )

    def model(self, ns: str, name: str, pool: str) -> None:
        uploads = self.root / ns / "uploads"
        uploads.mkdir(parents=True, exist_ok=True)
        onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
        self.apply(
            ns,
            {
                "apiVersion": API,
                "kind": "InferenceModel",
                "metadata": {"name": name},
                "spec": {
                    "server": pool,
                    "platform": "onnxruntime_onnx",
                    "maxBatchSize": 4,
                    "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                    "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                    "versions": [{"version": 1, "source": {"path": "uploads/relu.onnx"}}],
                },
            },
        )

    def ready(self, ns: str, kind: str, name: str, timeout: float = 240) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition(ns, kind, name, "Ready")
            return c if c.get("status") == "True" else None

        return wait_for_cluster(f"{ns}/{name} Ready", check, timeout, describe=self.describe)


@pytest.fixture(scope="module")
def tenants(cluster: Any, node: dict, images: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    suffix = uuid.uuid4().hex[:6]
    ops, a, b, c = (f"e2e-tv-{x}-{suffix}" for x in ("ops", "a", "b", "c"))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    for ns in (ops, a, b, c):
        cluster.kubectl("create", "namespace", ns)
    # the operator's own claim: the whole volume, a hostPath folder of the real node (the default class)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.kubectl("-n", ops, "apply", "-f", "-", input=json.dumps(claim))

    def bound() -> Path | None:
        pvc = json.loads(cluster.kubectl("-n", ops, "get", "pvc", "models", "-o", "json").stdout)
        if pvc.get("status", {}).get("phase") != "Bound":
            return None
        pv = cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
        return Path(pv["spec"]["hostPath"]["path"])

    root = wait_for_cluster("the operator's claim Bound", bound, 120)
    log = tmp_path_factory.mktemp("tenant-volumes") / "operator.log"
    args = [
        sys.executable, "-m", "kubeinfer.operator", "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(root), "--claim-name", "models", "--claim-namespace", ops,
        "--namespace", a, "--namespace", b, "--namespace", c, "--resync-seconds", "3",
        "--monitoring-namespace", "monitoring",
    ]  # fmt: skip
    with open(log, "wb") as out:
        operator = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    t = Tenants(cluster, images, ops, a, b, c, root, log, operator)
    try:
        yield t
    finally:
        for ns in (a, b, c):
            t.kubectl(
                ns, "delete", "inferencemodels,inferenceservers", "--all", "--wait=true", "--timeout=90s", check=False
            )
        processes.stop(operator)
        for ns in (a, b, c):
            cluster.release_finalizers(ns)
        for ns in (ops, a, b, c):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            cluster.kubectl(
                "delete", "pv", "-l", f"serving.kubeinfer.io/tenant-namespace={ns}", "--wait=false", check=False
            )


def test_a_pod_mounting_its_namespaces_claim_sees_only_its_folder(tenants: Tenants) -> None:
    t = tenants
    for ns in (t.a, t.b):
        t.pool(ns, "pool", replicas=0)
        t.model(ns, "relu", "pool")
    for ns in (t.a, t.b):
        wait_for_cluster(
            f"{ns}/relu Rendered",
            lambda ns=ns: t.condition(ns, "inferencemodel", "relu", "Rendered").get("status") == "True",
            120,
            describe=t.describe,
        )
    victim = t.root / t.b / "pool" / "relu" / "1" / "model.onnx"
    assert victim.is_file()
    claim = wait_for_cluster(
        "A's claim Bound",
        lambda: (p := t.get(t.a, "pvc", "kubeinfer-repository")).get("status", {}).get("phase") == "Bound" and p,
        120,
        describe=t.describe,
    )
    pv = t.cluster.kubectl_json("get", "pv", claim["spec"]["volumeName"])
    assert Path(pv["spec"]["hostPath"]["path"]) == t.root / t.a
    assert pv["metadata"]["labels"]["serving.kubeinfer.io/tenant-namespace"] == t.a

    # any pod of A, mounting A's claim without a subPath, as a tenant would
    attempts = [str(victim), f"/data/../{t.b}/pool/relu/1/model.onnx", f"/data/{t.b}/pool/relu/1/model.onnx"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "snoop"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
            "containers": [
                {
                    "name": "snoop",
                    "image": t.images["server"],
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", LISTING, *attempts],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "kubeinfer-repository"}}],
        },
    }
    t.apply(t.a, pod)
    wait_for_cluster(
        "the snooping pod finished",
        lambda: t.get(t.a, "pod", "snoop").get("status", {}).get("phase") in ("Succeeded", "Failed"),
        180,
        describe=lambda: t.kubectl(t.a, "describe", "pod", "snoop", check=False).stdout,
    )
    seen = json.loads(t.kubectl(t.a, "logs", "snoop").stdout.strip().splitlines()[-1])
    assert [n for n in seen["data"] if not n.startswith(".")] == ["pool", "uploads"], seen  # A's folder only
    assert t.b not in seen["parent"] and ".kubeinfer-staging" not in seen["parent"]
    assert all(result != "read" for result in seen["tried"].values()), seen["tried"]


def test_a_pool_with_a_token_refuses_calls_without_it(tenants: Tenants) -> None:
    t = tenants
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pool-token"},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    t.apply(t.a, secret)
    t.pool(t.a, "guarded", auth={"tokenSecret": {"name": "pool-token"}})
    t.model(t.a, "guarded-relu", "guarded")
    # Ready needs every replica's repository index: the operator's reads carry the token
    t.ready(t.a, "inferencemodel", "guarded-relu", timeout=300)
    ip = t.get(t.a, "service", "guarded")["spec"]["clusterIP"]
    base = f"http://{ip}:8000"

    def ready() -> bool:  # the Service's rules reach the node a moment after the endpoint is ready
        try:
            return httpx.get(f"{base}/v2/health/ready", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    wait_for_cluster("the pool's Service to answer its health probe without a token", ready, 60)  # probes: no token
    refused = httpx.get(f"{base}/v2/models/guarded-relu", timeout=10)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
    assert httpx.post(f"{base}/v2/repository/index", json={}, timeout=10).status_code == 401
    assert httpx.post(f"{base}/v2/logging", json={"log_verbose_level": 1}, timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{base}/v2/models/guarded-relu", headers=auth, timeout=10).status_code == 200

    client = grpcclient.InferenceServerClient(f"{ip}:8001")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("guarded-relu")
    assert "UNAUTHENTICATED" in str(err.value.status())
    meta = client.get_model_metadata("guarded-relu", headers={"authorization": f"Bearer {TOKEN}"})
    assert meta.name == "guarded-relu"
    client.close()

    deployment = t.get(t.a, "deployment", "guarded")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--auth-token-file=/var/run/kubeinfer/auth/token" in container["args"]


def test_each_pool_gets_a_network_policy_for_its_namespace_and_the_operator(tenants: Tenants) -> None:
    t = tenants
    t.pool(
        t.c, "open", replicas=0, networkPolicy={"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}
    )
    t.pool(t.c, "closed", replicas=0, networkPolicy={"enabled": False})
    policy = wait_for_cluster(
        "the NetworkPolicy", lambda: t.get(t.c, "networkpolicy", "open") or None, 60, describe=t.describe
    )
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "open"
    assert spec["policyTypes"] == ["Ingress", "Egress"]  # egress closed too: DNS only by default (issue #37)
    assert [rule["ports"] for rule in spec["egress"]] == [
        [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    ]
    serving, metrics = spec["ingress"]
    assert serving["from"][0] == {"podSelector": {}}  # the pool's own namespace
    assert serving["from"][1]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": t.ops}}
    assert serving["from"][2] == {"namespaceSelector": {"matchLabels": {"team": "x"}}}
    assert {p["port"] for p in serving["ports"]} == {8000, 8001}
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert [p["port"] for p in metrics["ports"]] == [8002]
    assert policy["metadata"]["ownerReferences"][0]["kind"] == "InferenceServer"
    wait_for_cluster(
        "the closed pool's Deployment", lambda: bool(t.get(t.c, "deployment", "closed")), 60, describe=t.describe
    )
    assert not t.get(t.c, "networkpolicy", "closed")
