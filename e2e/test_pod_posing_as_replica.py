"""Issue 37, item 1, end to end: a pod posing as a pool's replica is never read, on real pods of the real node.

A tenant who may create pods in a pool's namespace starts pods with the pool's labels, each answering every
request with 150 MB of JSON (what once made the operator read it whole and be OOM-killed, again after every
restart):

* one with the labels the pool's Service used to select on (name and instance): the Service now selects on
  the pool's uid label too, so it is not even among the Service's endpoints;
* one with every label of the real pod but the ReplicaSet's own ``pod-template-hash`` (with it, the
  ReplicaSet would adopt the pod and delete one too many): it is among the Service's endpoints, but no
  ReplicaSet of the pool's Deployment controls it, so the operator never calls it.

The operator (a host process, resync every 3 s) stays up, the pool's models stay Ready on its one real
replica (a new model is rendered, polled and Ready meanwhile), the pool's ``status.pods`` shows the real pod
only, and neither posing pod receives a single request.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest
from kubeinfer.operator.servers import manifests
from onnx import TensorProto

from tests.support import posing, processes
from tests.support.models import unary
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
POOL = "pool"


@dataclass
class Stage:
    cluster: Any
    images: dict
    ns: str
    root: Path
    log: Path
    operator: subprocess.Popen[bytes]

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> Any:
        return self.cluster.kubectl("-n", self.ns, *args, check=check, input=input, timeout=timeout)

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def get(self, kind: str, name: str = "", selector: str = "") -> dict[str, Any]:
        args = ["get", kind, *([name] if name else []), *(["-l", selector] if selector else []), "-o", "json"]
        proc = self.kubectl(*args, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def condition(self, kind: str, name: str, ctype: str) -> dict[str, Any]:
        conds = (self.get(kind, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == ctype), {})

    def describe(self) -> str:
        out = self.kubectl("get", "isrv,im,pods,endpointslices", "-o", "wide", check=False).stdout
        return out + "\n--- operator:\n" + self.log.read_text(errors="replace")[-6000:]

    def model(self, name: str) -> None:
        uploads = self.root / self.ns / "uploads"
        uploads.mkdir(parents=True, exist_ok=True)
        onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
        self.apply(
            {
                "apiVersion": API,
                "kind": "InferenceModel",
                "metadata": {"name": name},
                "spec": {
                    "server": POOL,
                    "platform": "onnxruntime_onnx",
                    "maxBatchSize": 4,
                    "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                    "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                    "versions": [{"version": 1, "source": {"path": "uploads/relu.onnx"}}],
                },
            }
        )

    def ready(self, kind: str, name: str, timeout: float = 240) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition(kind, name, "Ready")
            return c if c.get("status") == "True" else None

        return wait_for_cluster(f"{name} Ready", check, timeout, describe=self.describe)

    def posing_pod(self, name: str, labels: dict[str, str]) -> None:
        self.apply(posing.pod(name, labels, self.images["server"]))

    def requests_to(self, pod: str) -> list[str]:
        return posing.requests_seen(self.kubectl("logs", pod, check=False).stdout)

    def operator_peak_mib(self) -> float:
        status = Path(f"/proc/{self.operator.pid}/status").read_text()
        return int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1]) / 1024


@pytest.fixture(scope="module")
def stage(cluster: Any, node: dict, images: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    ns = f"e2e-posing-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    cluster.kubectl("create", "namespace", ns)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(claim))

    def bound() -> Path | None:
        pvc = json.loads(cluster.kubectl("-n", ns, "get", "pvc", "models", "-o", "json").stdout)
        if pvc.get("status", {}).get("phase") != "Bound":
            return None
        return Path(cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])["spec"]["hostPath"]["path"])

    root = wait_for_cluster("the operator's claim Bound", bound, 120)
    log = tmp_path_factory.mktemp("posing") / "operator.log"
    args = [
        sys.executable, "-m", "kubeinfer.operator", "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(root), "--claim-name", "models", "--claim-namespace", ns,
        "--namespace", ns, "--resync-seconds", "3",
    ]  # fmt: skip
    with open(log, "wb") as out:
        operator = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    s = Stage(cluster, images, ns, root, log, operator)
    try:
        yield s
    finally:
        s.kubectl("delete", "inferencemodels,inferenceservers", "--all", "--wait=true", "--timeout=90s", check=False)
        processes.stop(operator)
        cluster.release_finalizers(ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        volumes = f"serving.kubeinfer.io/tenant-namespace={ns}"
        cluster.kubectl("delete", "pv", "-l", volumes, "--wait=false", check=False)


def test_a_pod_posing_as_a_replica_is_never_read(stage: Stage) -> None:
    s = stage
    s.apply(
        {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": POOL},
            "spec": {
                "image": s.images["server"],
                "imagePullPolicy": "IfNotPresent",
                "replicas": 1,
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                "server": {"pollIntervalSeconds": 1},
                "probes": {"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1}},
            },
        }
    )
    s.model("relu")
    s.ready("inferencemodel", "relu", timeout=300)
    uid = s.get("inferenceserver", POOL)["metadata"]["uid"]
    assert s.get("service", POOL)["spec"]["selector"][manifests.POOL_UID_LABEL] == uid  # a new pool: at once
    (real,) = s.get("pods", selector=manifests.selector_string(POOL))["items"]
    real_labels = dict(real["metadata"]["labels"])
    assert real_labels[manifests.POOL_UID_LABEL] == uid

    # the pods a tenant can make: the old selector's labels only, and every label but the ReplicaSet's hash
    by_name = manifests.labels(POOL)
    fully = {k: v for k, v in real_labels.items() if k != "pod-template-hash"}
    s.posing_pod("posing-by-name", by_name)
    s.posing_pod("posing-fully", fully)
    running = {}
    for pod in ("posing-by-name", "posing-fully"):
        running[pod] = wait_for_cluster(
            f"{pod} running",
            lambda pod=pod: (
                (p := s.get("pod", pod)).get("status", {}).get("podIP")
                and "listening" in s.kubectl("logs", pod, check=False).stdout
                and p
            ),
            180,
            describe=s.describe,
        )

    def addresses() -> dict[str, bool]:
        slices = s.get("endpointslices", selector=f"kubernetes.io/service-name={POOL}").get("items") or []
        return {
            a: (e.get("conditions") or {}).get("ready") is not False
            for piece in slices
            for e in piece.get("endpoints") or ()
            for a in e.get("addresses") or ()
        }

    fully_ip, by_name_ip = running["posing-fully"]["status"]["podIP"], running["posing-by-name"]["status"]["podIP"]
    seen = wait_for_cluster(
        "the fully labelled pod among the Service's ready endpoints",
        lambda: (found := addresses()).get(fully_ip) and found,
        60,
        describe=s.describe,
    )
    assert by_name_ip not in seen  # the Service selects on the pool's uid: the old labels are not enough
    assert real["status"]["podIP"] in seen

    # a new model is rendered, its replicas asked to poll it, every replica's index read; resyncs go on
    s.model("relu-2")
    s.ready("inferencemodel", "relu-2", timeout=120)
    time.sleep(12)  # four resync periods with the posing pod among the endpoints
    assert s.operator.poll() is None, "the operator exited\n" + s.describe()
    for name in ("relu", "relu-2"):
        obj = s.get("inferencemodel", name)
        assert s.condition("inferencemodel", name, "Ready")["status"] == "True", s.describe()
        (row,) = obj["status"]["versionStates"]
        assert (row["replicas"], row["readyReplicas"]) == (1, 1), row  # the real replica only
    pods = s.get("inferenceserver", POOL)["status"]["pods"]
    assert [p["name"] for p in pods] == [real["metadata"]["name"]], pods
    assert s.requests_to("posing-fully") == [] and s.requests_to("posing-by-name") == []
    assert "ignoring endpoint" in s.log.read_text(errors="replace")
    print(f"operator peak RSS: {s.operator_peak_mib():.0f} MiB")
