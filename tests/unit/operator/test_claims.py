"""The repository claim check compares the storage claims are bound to, not their names."""

from __future__ import annotations

import pytest
from kubeinfer.operator.artifacts import ArtifactError
from kubeinfer.operator.claims import ClaimCheck, volume_identity


def pv(name: str, **source) -> dict:
    return {"metadata": {"name": name}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["RWX"], **source}}


def pvc(volume: str | None, phase: str = "Bound") -> dict:
    return {"spec": {"volumeName": volume} if volume else {}, "status": {"phase": phase}}


OBJECTS = {
    ("PersistentVolumeClaim", "models", "ops"): pvc("pv-a"),
    ("PersistentVolumeClaim", "models", "team-1"): pvc("pv-a2"),  # another PV, same NFS export
    ("PersistentVolumeClaim", "models", "team-2"): pvc("pv-b"),  # same name, other storage
    ("PersistentVolumeClaim", "shared", "team-3"): pvc("pv-a3"),  # another name, same CSI volume? no: same NFS
    ("PersistentVolumeClaim", "pending", "team-1"): pvc(None, "Pending"),
    ("PersistentVolume", "pv-a", None): pv("pv-a", nfs={"server": "nfs.local", "path": "/exports/models/"}),
    ("PersistentVolume", "pv-a2", None): pv("pv-a2", nfs={"server": "nfs.local", "path": "/exports/models"}),
    ("PersistentVolume", "pv-a3", None): pv("pv-a3", nfs={"server": "nfs.local", "path": "/exports//models"}),
    ("PersistentVolume", "pv-b", None): pv("pv-b", nfs={"server": "nfs.local", "path": "/exports/other"}),
}


def read(kind: str, name: str, namespace: str | None = None):
    read.calls += 1  # type: ignore[attr-defined]
    return OBJECTS.get((kind, name, namespace))


def test_volume_identity():
    csi = {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1", "volumeAttributes": {"x": "y"}}}
    assert volume_identity(pv("a", **csi)) == volume_identity(pv("b", **csi)) == ("csi", "efs.csi.aws.com", "fs-1")
    assert volume_identity(pv("a", hostPath={"path": "/data/"})) == ("hostPath", "/data")
    assert volume_identity(pv("a", cephfs={"monitors": ["m"], "path": "/"}))[0] == "cephfs"
    assert volume_identity(pv("a", nfs={"server": "s", "path": "/x"})) != volume_identity(
        pv("a", nfs={"server": "s", "path": "/y"})
    )


def test_claims_are_compared_by_bound_storage():
    read.calls = 0  # type: ignore[attr-defined]
    check = ClaimCheck(read, "models", "ops")
    check.check("team-1", "pool", "models")  # another PV on the same export
    check.check("team-3", "pool", "shared")  # another claim name, same storage
    with pytest.raises(ArtifactError) as err:
        check.check("team-2", "pool", "models")
    assert err.value.reason == "ClaimNotMounted"
    assert "bound to volume 'pv-b' (NFS nfs.local:/exports/other)" in err.value.message
    assert "operator writes to volume 'pv-a' (NFS nfs.local:/exports/models)" in err.value.message
    with pytest.raises(ArtifactError) as err:
        check.check("pending", "pool", "team-1")
    assert err.value.reason == "ClaimNotBound"
    with pytest.raises(ArtifactError, match="does not exist in namespace 'nowhere'"):
        check.check("nowhere", "pool", "models")
    calls = read.calls  # type: ignore[attr-defined]
    check.check("team-1", "pool", "models")
    assert read.calls == calls  # type: ignore[attr-defined]  # cached


def test_without_the_operator_namespace_names_are_compared():
    check = ClaimCheck(read, "models", None)
    check.check("anywhere", "pool", "models")
    with pytest.raises(ArtifactError, match="use that claim"):
        check.check("anywhere", "pool", "other")
    ClaimCheck(read, None, None).check("anywhere", "pool", "whatever")  # not configured: nothing checked


def test_the_operator_claim_itself_must_be_bound():
    with pytest.raises(ArtifactError) as err:
        ClaimCheck(read, "team-1", "pending").check("team-1", "pool", "models")
    assert err.value.reason == "OperatorClaimUnusable"
