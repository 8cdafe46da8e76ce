"""A namespace with the operator running as a host process on a volume of its own (e2e helpers).

The shared cluster's pool of pre-made hostPath PersistentVolumes runs dry when many sessions use it, so
the claim here binds a volume made for it (a hostPath folder of the real node, as the pool's are), deleted
afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import processes
from tests.support.waiting import wait_for_cluster

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class HostOperator:
    ns: str
    root: Path
    log: Path
    proc: subprocess.Popen[bytes]
    #: the further namespaces the operator watches (``host_operator``'s ``others``), in that order
    others: tuple[str, ...] = ()

    def uploads(self, ns: str = "") -> Path:
        """The namespace's (default: the first one's) folder on the volume that ``source.path`` of its models
        reads from."""
        folder = self.root / (ns or self.ns) / "uploads"
        folder.mkdir(parents=True, exist_ok=True)
        return folder


API = "serving.kubeinfer.io/v1alpha1"


def pool_server(name: str, images: dict[str, Any], memory: str = "128Mi", **spec: Any) -> dict[str, Any]:
    """An InferenceServer of this tree's server image that notices models and turns ready fast (1 s polls
    and probes): what the e2e pools share; ``spec``: the test's own fields (one given replaces the default)."""
    base = {
        "image": images["info"]["images"][0]["hash_ref"],
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": "50m", "memory": memory}},
        "server": {"pollIntervalSeconds": 1},
        "probes": {"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1}},
    }
    return {"apiVersion": API, "kind": "InferenceServer", "metadata": {"name": name}, "spec": {**base, **spec}}


def matmul_model(name: str, server: str, size: int) -> dict[str, Any]:
    """An InferenceModel of ``tests.support.models.matmul(size)`` uploaded as ``uploads/<name>.onnx`` (IN → OUT,
    FP32, batches of 4, one CPU instance) in pool ``server``: the model-cache pools' models."""
    return {
        "apiVersion": API,
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {
            "server": server,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 4,
            "instanceGroups": [{"count": 1, "kind": "KIND_CPU"}],
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [size]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [size]}],
            "versions": [{"version": 1, "source": {"path": f"uploads/{name}.onnx"}}],
        },
    }


@dataclass
class InNamespace:
    """kubectl in one namespace, and the JSON of its objects: what the e2e tests of a host operator's
    namespace call (subclass it with the test's own fields)."""

    cluster: Any
    ns: str

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", self.ns, *args, check=check, input=input)

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def get(self, kind: str, name: str = "") -> dict[str, Any]:
        """The object (or, without a name, the list of that kind), or {} when it does not exist (yet)."""
        proc = self.kubectl("get", kind, *([name] if name else []), "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}


@contextmanager
def host_operator(
    cluster: Any,
    node: dict,
    prefix: str,
    log_dir: Path,
    extra_args: tuple[str, ...] = (),
    others: tuple[str, ...] = (),
) -> Iterator[HostOperator]:
    """This tree's CRDs applied, a fresh namespace, a claim ``models`` on a volume of its own, and the
    operator (this tree's code) watching the namespace with that claim as its repository (``extra_args``:
    more of its command-line options). ``others``: further namespaces it watches too, each made fresh as
    ``<prefix>-<other>-<suffix>`` (``HostOperator.others``), their pools on folders of the same volume."""
    suffix = uuid.uuid4().hex[:6]
    ns, pv_name = f"{prefix}-{suffix}", f"{prefix}-{suffix}"
    more = tuple(f"{prefix}-{other}-{suffix}" for other in others)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    for name in (ns, *more):
        cluster.kubectl("create", "namespace", name)
    folder = Path(node["volumes"]) / pv_name
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": node["storage_class"],
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {"namespace": ns, "name": "models"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node["name"]]}
                            ]
                        }
                    ]
                }
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pv))
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": node["storage_class"],
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(claim))

    def bound() -> bool:
        pvc = json.loads(cluster.kubectl("-n", ns, "get", "pvc", "models", "-o", "json").stdout)
        return pvc.get("status", {}).get("phase") == "Bound"

    wait_for_cluster("the operator's claim Bound", bound, 120)
    log = log_dir / "operator.log"
    args = [
        sys.executable, "-m", "kubeinfer.operator", "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(folder), "--claim-name", "models", "--claim-namespace", ns,
        "--namespace", ns, *(a for name in more for a in ("--namespace", name)), "--resync-seconds", "3", *extra_args,
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        yield HostOperator(ns, folder, log, proc, more)
    finally:
        for name in (ns, *more):
            cluster.kubectl(
                "-n", name, "delete", "inferencemodels,inferenceservers", "--all", "--wait=true", "--timeout=90s",
                check=False,
            )  # fmt: skip
        processes.stop(proc)
        for name in (ns, *more):
            cluster.release_finalizers(name)
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
            cluster.kubectl(
                "delete", "pv", "-l", f"serving.kubeinfer.io/tenant-namespace={name}", "--wait=false", check=False
            )
        cluster.kubectl("delete", "pv", pv_name, "--wait=false", check=False)
