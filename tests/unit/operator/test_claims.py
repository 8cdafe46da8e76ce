"""The repository claim check: a server's claim must reach exactly its namespace's folder of the operator's
volume (compared by bound storage, not by claim names), and the per-namespace sources the operator provides."""

from __future__ import annotations

import pytest
from kubeinfer.operator.api.server_types import InferenceServerSpec
from kubeinfer.operator.replicas.server_access import PLAIN, AccessBook, ServerAccess
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.volume.claims import (
    NAMESPACE_ANNOTATION,
    ClaimCheck,
    namespace_source,
    reaches_namespace,
    volume_identity,
)


def pv(name: str, annotations: dict | None = None, **source) -> dict:
    meta = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {"metadata": meta, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["RWX"], **source}}


def pvc(volume: str | None, phase: str = "Bound") -> dict:
    return {"spec": {"volumeName": volume} if volume else {}, "status": {"phase": phase}}


NFS = {"server": "nfs.local"}
OBJECTS = {
    ("PersistentVolumeClaim", "models", "ops"): pvc("pv-root"),
    ("PersistentVolumeClaim", "mine", "team-1"): pvc("pv-team-1"),
    ("PersistentVolumeClaim", "whole", "team-1"): pvc("pv-root-again"),  # another PV on the same export
    ("PersistentVolumeClaim", "root", "team-1"): pvc("pv-root"),
    ("PersistentVolumeClaim", "elsewhere", "team-2"): pvc("pv-other"),
    ("PersistentVolumeClaim", "neighbour", "team-2"): pvc("pv-team-1"),  # team-1's folder
    ("PersistentVolumeClaim", "pending", "team-1"): pvc(None, "Pending"),
    ("PersistentVolume", "pv-root", None): pv("pv-root", nfs={**NFS, "path": "/exports/models/"}),
    ("PersistentVolume", "pv-root-again", None): pv("pv-root-again", nfs={**NFS, "path": "/exports//models"}),
    ("PersistentVolume", "pv-team-1", None): pv("pv-team-1", nfs={**NFS, "path": "/exports/models/team-1"}),
    ("PersistentVolume", "pv-other", None): pv("pv-other", nfs={**NFS, "path": "/exports/other"}),
}


def read(kind: str, name: str, namespace: str | None = None):
    read.calls += 1  # type: ignore[attr-defined]
    return OBJECTS.get((kind, name, namespace))


def test_volume_identity():
    efs = {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1:/models", "volumeAttributes": {"x": "y"}}}
    assert (
        volume_identity(pv("a", **efs))
        == volume_identity(pv("b", **efs))
        == ("csi", "efs.csi.aws.com", "fs-1", "/models")
    )
    other = {"csi": {"driver": "x.csi", "volumeHandle": "h-1"}}
    assert volume_identity(pv("a", **other)) == ("csi", "x.csi", "h-1")
    nfs_csi = {"driver": "nfs.csi.k8s.io", "volumeHandle": "s#/e#", "volumeAttributes": {"server": "s", "share": "/e"}}
    assert volume_identity(pv("a", csi=nfs_csi)) == volume_identity(pv("b", nfs={"server": "s", "path": "/e/"}))
    assert volume_identity(pv("a", hostPath={"path": "/data/"})) == ("hostPath", "/data")
    assert volume_identity(pv("a", cephfs={"monitors": ["m"], "path": "/"}))[0] == "cephfs"
    assert volume_identity(pv("a", nfs={"server": "s", "path": "/x"})) != volume_identity(
        pv("a", nfs={"server": "s", "path": "/y"})
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"hostPath": {"path": "/srv/models/"}}, {"hostPath": {"path": "/srv/models/team", "type": "Directory"}}),
        ({"nfs": {**NFS, "path": "/e"}}, {"nfs": {**NFS, "path": "/e/team", "readOnly": True}}),
        (
            {"csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "h", "volumeAttributes": {"server": "s", "share": "/e", "subDir": "m"}}},
            {"csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "h#kubeinfer#team", "readOnly": True,
                     "volumeAttributes": {"server": "s", "share": "/e/m/team"}}},
        ),
        (
            {"csi": {"driver": "cephfs.csi.ceph.com", "volumeHandle": "c", "volumeAttributes": {"fsName": "fs", "rootPath": "/v"}}},
            {"csi": {"driver": "cephfs.csi.ceph.com", "volumeHandle": "c#kubeinfer#team", "readOnly": True,
                     "volumeAttributes": {"fsName": "fs", "rootPath": "/v/team"}}},
        ),
        (
            {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1"}},
            {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1:/team", "readOnly": True, "volumeAttributes": {}}},
        ),
        ({"csi": {"driver": "disk.csi.example", "volumeHandle": "d"}}, None),
        ({"azureFile": {"shareName": "s"}}, None),
    ],
)  # fmt: skip
def test_namespace_source(source, expected):
    assert namespace_source(pv("root", **source), "team") == expected


def test_local_volumes_keep_their_node():
    affinity = {
        "required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["n"]}]}]}
    }
    root = {"metadata": {"name": "r"}, "spec": {"local": {"path": "/mnt/m"}, "nodeAffinity": affinity}}
    assert namespace_source(root, "t") == {"local": {"path": "/mnt/m/t"}, "nodeAffinity": affinity}


def test_a_claim_must_reach_exactly_its_namespace_folder():
    read.calls = 0  # type: ignore[attr-defined]
    check = ClaimCheck(read, "models", "ops")
    check.check("team-1", "pool", "mine")  # /exports/models/team-1
    for claim in ("whole", "root"):  # the whole volume, by another PV on the same export or the operator's own
        with pytest.raises(ArtifactError) as err:
            check.check("team-1", "pool", claim)
        assert err.value.reason == "ClaimTooBroad"
        assert "reaches the whole repository volume" in err.value.message
        assert "leave spec.repository.claimName out" in err.value.message
    with pytest.raises(ArtifactError) as err:
        check.check("team-2", "pool", "elsewhere")
    assert err.value.reason == "ClaimNotMounted"
    assert "bound to volume 'pv-other' (NFS nfs.local:/exports/other)" in err.value.message
    assert "this namespace's models are in NFS nfs.local:/exports/models/team-2" in err.value.message
    with pytest.raises(ArtifactError) as err:  # another namespace's folder
        check.check("team-2", "pool", "neighbour")
    assert err.value.reason == "ClaimNotMounted"
    with pytest.raises(ArtifactError) as err:
        check.check("team-1", "pool", "pending")
    assert err.value.reason == "ClaimNotBound"
    with pytest.raises(ArtifactError, match="does not exist in namespace 'nowhere'"):
        check.check("nowhere", "pool", "models")
    calls = read.calls  # type: ignore[attr-defined]
    check.check("team-1", "pool", "mine")
    assert read.calls == calls  # type: ignore[attr-defined]  # cached


def test_an_admin_annotation_vouches_only_for_sources_the_operator_cannot_divide():
    own = pv("root", azureFile={"shareName": "models"})
    vouched = pv("t1", {NAMESPACE_ANNOTATION: "team-1"}, azureFile={"shareName": "models-team-1"})
    assert reaches_namespace(own, vouched, "team-1")
    assert not reaches_namespace(own, vouched, "team-2")
    nfs_root = pv("root", nfs={**NFS, "path": "/e"})  # a divisible source: the path decides, not the annotation
    forged = pv("t1", {NAMESPACE_ANNOTATION: "team-1"}, nfs={**NFS, "path": "/e"})
    assert not reaches_namespace(nfs_root, forged, "team-1")


def test_not_configured_means_not_checked_and_nothing_provided():
    ClaimCheck(read, None, None).check("anywhere", "pool", "whatever")
    with pytest.raises(ArtifactError) as err:
        ClaimCheck(read, None, None).own_volume()
    assert err.value.reason == "ClaimRequired"


def test_the_operator_claim_itself_must_be_bound():
    with pytest.raises(ArtifactError) as err:
        ClaimCheck(read, "pending", "team-1").check("team-1", "pool", "mine")
    assert err.value.reason == "OperatorClaimUnusable"


def test_an_expired_lookup_is_made_once_however_many_threads_ask():
    """At the end of a cache period every model of a namespace asks at once: one API read each, not one per
    thread (claims, the tenant claim the operator provides, a pool's auth Secrets)."""
    import threading
    import time

    from kubeinfer.operator.volume.tenant_volumes import TenantVolumes

    calls: list[tuple] = []

    def slow_read(*key):
        calls.append(key)
        time.sleep(0.05)  # an API round trip: every other thread arrives meanwhile
        return OBJECTS.get(key if len(key) == 3 else (*key, None))

    claims = ClaimCheck(slow_read, "models", "ops")
    secret = {"data": {"token": "dG9rZW4="}}
    book = AccessBook(lambda ns, name: calls.append(("Secret", name, ns)) or time.sleep(0.05) or secret)
    spec = {"auth": {"tokenSecret": {"name": "t"}}}

    class Kube:
        def read_core(self, *key):
            calls.append(key)
            time.sleep(0.05)
            return None

        def create_core(self, manifest):
            calls.append(("create", manifest["kind"]))

    volumes = TenantVolumes(Kube(), ClaimCheck(lambda *k: OBJECTS.get((*k, None)[:3]), "models", "ops"))
    for ask in (
        lambda: claims.check("team-1", "pool", "mine"),
        lambda: book.for_server("team-1", "pool", spec),
        lambda: volumes.provide("team-1"),
    ):
        calls.clear()
        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(calls) == len(set(calls)), calls  # each object read (or made) once


def test_a_pools_access_is_one_entry_whether_its_spec_comes_typed_or_as_written() -> None:
    """The server controller asks with the object's spec, the model controller with the typed spec it parsed
    once: both find the same cached access (one read of the pool's token Secret per ttl, not two)."""
    reads: list[str] = []
    book = AccessBook(lambda ns, name: reads.append(name) or {"data": {"token": "dG9rZW4="}})
    written = {"image": "i", "auth": {"tokenSecret": {"name": "t"}}}
    first = book.for_server("team-1", "pool", written)
    second = book.for_server("team-1", "pool", InferenceServerSpec.from_body({"spec": written}))
    assert isinstance(first, ServerAccess) and first.headers == {"Authorization": "Bearer token"}
    assert second == first and reads == ["t"]
    assert (
        book.for_server("team-1", "pool", InferenceServerSpec.from_body({"spec": {"image": "i", "auth": {}}})) is PLAIN
    )
