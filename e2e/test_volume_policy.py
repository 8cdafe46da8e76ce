"""Issue #37 item 8: the chart's ValidatingAdmissionPolicy holds the operator's power over PersistentVolumes.

The operator's service account may create PersistentVolumes (its tenant volumes). The chart binds a
ValidatingAdmissionPolicy to that account: the real API server lets it create only volumes shaped like its
tenant volumes (``<repository.volumeRoot>/<namespace>``, bound to that namespace's tenant claim, Retain,
ReadOnlyMany, a hostPath of type Directory) and delete only volumes it manages. Each request below is sent as the
operator's account (``kubectl --as``) with ``--dry-run=server``: admission runs, nothing is stored.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[1] / "helm" / "kubeinfer"
ROOT = "/srv/kubeinfer-models"
TENANT = "team-a"


def _volume(name: str, path: str = f"{ROOT}/{TENANT}", **spec: Any) -> dict[str, Any]:
    """A PersistentVolume as operator/volume/tenant_volumes.py makes one, with ``spec`` overriding fields."""
    body: dict[str, Any] = {
        "hostPath": {"path": path, "type": "Directory"},
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadOnlyMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "volumeMode": "Filesystem",
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": TENANT,
            "name": "kubeinfer-repository",
        },
    }
    body.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "kubeinfer-operator",
                "serving.kubeinfer.io/tenant-namespace": TENANT,
            },
        },
        "spec": body,
    }


def test_the_operators_account_makes_only_tenant_volumes(cluster, helm, kubectl) -> None:
    ns = f"e2e-vap-{uuid.uuid4().hex[:6]}"
    release = f"vap{uuid.uuid4().hex[:4]}"
    sa = f"system:serviceaccount:{ns}:{release}-kubeinfer-operator"
    unmanaged = f"e2e-unmanaged-{uuid.uuid4().hex[:6]}"
    try:
        helm(
            "install", release, str(CHART), "-n", ns, "--create-namespace",
            "--set", f"repository.volumeRoot.hostPath={ROOT}", "--set", "repository.create=false",
        )  # fmt: skip

        def create(obj: dict[str, Any]) -> tuple[bool, str]:
            proc = kubectl("create", "--dry-run=server", "--as", sa, "-f", "-", input=json.dumps(obj), check=False)
            return proc.returncode == 0, proc.stderr

        good = _volume(f"kubeinfer-{TENANT}-good")
        root = _volume("kubeinfer-root", path="/")
        # the API server reads a new policy a moment after it is created: wait until it refuses the worst case
        deadline = time.monotonic() + 60
        while create(root)[0]:
            assert time.monotonic() < deadline, "the admission policy never took effect"
            time.sleep(1)
        ok, why = create(good)
        assert ok, why
        bad: dict[str, tuple[dict[str, Any], str]] = {
            "the node's root": (root, "path is its namespace's folder"),
            "another root": (_volume("b1", path=f"/etc/{TENANT}"), "volumeRoot.hostPath"),
            "created on demand": (
                _volume("b3", hostPath={"path": f"{ROOT}/{TENANT}", "type": "DirectoryOrCreate"}),
                "type Directory",
            ),
            "reclaimed by deletion": (_volume("b4", persistentVolumeReclaimPolicy="Delete"), "Retain"),
            "writable": (_volume("b5", accessModes=["ReadWriteMany"]), "ReadOnlyMany"),
            "another claim": (
                _volume("b6", claimRef={"namespace": TENANT, "name": "someone-elses"}),
                "bound to the tenant claim",
            ),
            "another namespace's claim": (
                _volume("b7", claimRef={"namespace": "kube-system", "name": "kubeinfer-repository"}),
                "bound to the tenant claim",
            ),
        }
        unlabelled = copy.deepcopy(good)
        unlabelled["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
        bad["not labelled as the operator's"] = (unlabelled, "managed-by=kubeinfer-operator")
        for what, (obj, message) in bad.items():
            ok, why = create(obj)
            assert not ok and message in why, (what, why)
        # a volume the operator does not manage cannot be deleted by it
        kubectl("create", "-f", "-", input=json.dumps(_volume(unmanaged) | {"metadata": {"name": unmanaged}}))
        proc = kubectl("delete", "pv", unmanaged, "--dry-run=server", "--as", sa, check=False)
        assert proc.returncode != 0 and "managed-by=kubeinfer-operator" in proc.stderr, proc.stderr
        # other accounts are not this policy's business (the admin's own request goes through)
        admin = kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(root), check=False)
        assert admin.returncode == 0, admin.stderr
    finally:
        kubectl("delete", "pv", unmanaged, "--ignore-not-found", check=False)
        helm("uninstall", release, "-n", ns, check=False)
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
