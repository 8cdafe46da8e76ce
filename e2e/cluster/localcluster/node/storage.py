"""The default StorageClass and its pool of pre-made hostPath PersistentVolumes on the node."""

from __future__ import annotations

import uuid
from pathlib import Path

from ..node import NODE_NAME, NodeError

STORAGE_CLASS = "local-hostpath"
#: Available PersistentVolumes ``up`` keeps in the pool (each claim binds one; released ones are retained).
PV_POOL = 10


def ensure_storage(api, p: dict) -> int:
    """A default StorageClass of pre-made hostPath PersistentVolumes on the real node, topped up to PV_POOL
    Available ones (each claim binds one; Retain keeps a released volume's data). Returns PVs created."""
    sc = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }
    code, text = api.call("POST", "/apis/storage.k8s.io/v1/storageclasses", sc)
    if code not in (201, 409):
        raise NodeError(f"creating StorageClass {STORAGE_CLASS}: HTTP {code}: {text}")
    pvs = (api.get_json("/api/v1/persistentvolumes") or {}).get("items", [])
    available = [
        pv
        for pv in pvs
        if pv["spec"].get("storageClassName") == STORAGE_CLASS and (pv.get("status") or {}).get("phase") == "Available"
    ]
    created = 0
    for _ in range(PV_POOL - len(available)):
        name = f"local-{uuid.uuid4().hex[:8]}"
        folder = Path(p["volumes"]) / name
        folder.mkdir(parents=True)
        folder.chmod(0o777)  # any pod user may write (as local-path-provisioner does); fsGroup can't chown hostPath
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"kubeinfer.io/volume-pool": "local"}},
            "spec": {
                "capacity": {"storage": "1Ti"},  # nominal: hostPath does not enforce a size
                "accessModes": ["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": STORAGE_CLASS,
                "hostPath": {"path": str(folder), "type": "Directory"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                                ]
                            }
                        ]
                    }
                },
            },
        }
        code, text = api.call("POST", "/api/v1/persistentvolumes", pv)
        if code != 201:
            raise NodeError(f"creating PersistentVolume {name}: HTTP {code}: {text}")
        created += 1
    return created
