"""Which storage does an InferenceServer's repository claim reach? Only its own namespace's folder.

The operator renders models onto the volume mounted at ``--repository-root`` (its own PVC); namespace
``ns``'s models live in ``<root>/<ns>/``. A server pod mounts a claim in *its* namespace, and that claim
must reach that folder and nothing above it: a claim bound to the whole volume would let any pod of the
namespace read and write every other namespace's models, whatever the operator checks.

So the check compares what claims are bound to, not their names: the PersistentVolume's source (NFS
server + path, host/local path, the CSI drivers whose sub-folders are known) must be the operator's own
source with ``/<ns>`` appended. A PersistentVolume of another kind reaches a namespace's folder when a
cluster admin (only they create PersistentVolumes) annotates it ``serving.kubeinfer.io/repository-namespace:
<ns>``. ``namespace_source`` is the pure half that ``tenant_volumes`` also uses to provide such claims.

Lookups are cached for ``ttl`` seconds: a resync of many models on one server costs no API call.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..sources.artifacts import ArtifactError

#: set by an admin on a PersistentVolume that reaches exactly <root>/<namespace>/ of the operator's volume
NAMESPACE_ANNOTATION = "serving.kubeinfer.io/repository-namespace"

#: PersistentVolume spec fields that are not where the data lives
_NOT_SOURCE = {
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeMode",
    "volumeAttributesClassName",
}

#: CSI drivers whose folder is a path attribute: driver → (how the identity names it, attribute)
_CSI_PATHS = {"nfs.csi.k8s.io": ("nfs", "share"), "cephfs.csi.ceph.com": ("cephfs", "rootPath")}
#: CSI drivers whose folder is part of the volume handle, "<filesystem>:<path>" (AWS EFS)
_CSI_HANDLE_PATHS = {"efs.csi.aws.com"}
SUPPORTED_SOURCES = "hostPath, local, nfs, and CSI nfs.csi.k8s.io, cephfs.csi.ceph.com (static) and efs.csi.aws.com"


def _norm(path: str) -> str:
    return posixpath.normpath(path or "/")


def volume_identity(pv: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a PersistentVolume's data lives, comparable across PersistentVolume objects."""
    spec = pv.get("spec") or {}
    if csi := spec.get("csi"):
        driver, attrs = str(csi.get("driver")), csi.get("volumeAttributes") or {}
        if driver in _CSI_PATHS:
            kind, attr = _CSI_PATHS[driver]
            where = attrs.get("server") or attrs.get("fsName") or ""
            return (
                kind,
                str(where),
                _norm(posixpath.join(str(attrs.get(attr) or "/"), str(attrs.get("subDir") or ""))),
            )
        if driver in _CSI_HANDLE_PATHS:
            fs, _, path = str(csi.get("volumeHandle")).partition(":")
            return ("csi", driver, fs, _norm(path.split(":")[0] or "/"))
        return ("csi", driver, str(csi.get("volumeHandle")))
    if nfs := spec.get("nfs"):
        return ("nfs", str(nfs.get("server")), _norm(str(nfs.get("path"))))
    if local := spec.get("local"):
        return ("local", _norm(str(local.get("path"))), json.dumps(spec.get("nodeAffinity"), sort_keys=True))
    if host := spec.get("hostPath"):
        return ("hostPath", _norm(str(host.get("path"))))
    sources = {k: v for k, v in spec.items() if k not in _NOT_SOURCE}
    if sources:
        kind = sorted(sources)[0]
        return (kind, json.dumps(sources[kind], sort_keys=True))
    return ("pv", str((pv.get("metadata") or {}).get("name")))


def describe(identity: tuple[str, ...]) -> str:
    kind, *rest = identity
    if kind in ("nfs", "cephfs"):
        return f"{kind.upper() if kind == 'nfs' else 'CephFS'} {rest[0]}:{rest[1]}"
    if kind == "csi":
        return f"CSI {rest[0]} volume {':'.join(rest[1:])}"
    if kind in ("local", "hostPath"):
        return f"{kind} {rest[0]}"
    return kind


def namespace_source(pv: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
    """PersistentVolume spec fields (source, and node affinity for ``local``) of ``<pv's folder>/<namespace>``,
    read-only where the source can say so; None when the source is not one whose sub-folder is known."""
    spec = pv.get("spec") or {}
    if host := spec.get("hostPath"):
        return {"hostPath": {"path": posixpath.join(_norm(host["path"]), namespace), "type": "Directory"}}
    if local := spec.get("local"):
        out: dict[str, Any] = {"local": {**local, "path": posixpath.join(_norm(local["path"]), namespace)}}
        if spec.get("nodeAffinity"):
            out["nodeAffinity"] = spec["nodeAffinity"]
        return out
    if nfs := spec.get("nfs"):
        return {
            "nfs": {"server": nfs["server"], "path": posixpath.join(_norm(nfs["path"]), namespace), "readOnly": True}
        }
    if csi := spec.get("csi"):
        driver = str(csi.get("driver"))
        attrs = dict(csi.get("volumeAttributes") or {})
        if driver in _CSI_PATHS:
            attr = _CSI_PATHS[driver][1]
            attrs[attr] = posixpath.join(
                _norm(str(attrs.get(attr) or "/")), str(attrs.pop("subDir", "") or ""), namespace
            )
            handle = f"{csi.get('volumeHandle')}#kubeinfer#{namespace}"
        elif driver in _CSI_HANDLE_PATHS:
            fs, _, rest = str(csi.get("volumeHandle")).partition(":")
            path, _, access_point = rest.partition(":")
            handle = f"{fs}:{posixpath.join(_norm(path or '/'), namespace)}" + (
                f":{access_point}" if access_point else ""
            )
        else:
            return None
        source = {k: v for k, v in csi.items() if k not in ("volumeHandle", "volumeAttributes", "readOnly")}
        return {"csi": {**source, "volumeHandle": handle, "volumeAttributes": attrs, "readOnly": True}}
    return None


def reaches_namespace(own: Mapping[str, Any], theirs: Mapping[str, Any], namespace: str) -> bool:
    """Does PersistentVolume ``theirs`` reach exactly ``namespace``'s folder of the operator's volume ``own``?"""
    expected = namespace_source(own, namespace)
    if expected is not None and volume_identity({"spec": expected}) == volume_identity(theirs):
        return True
    annotations = (theirs.get("metadata") or {}).get("annotations") or {}
    return expected is None and annotations.get(NAMESPACE_ANNOTATION) == namespace


class ClaimCheck:
    """Compares servers' claims with the operator's own (``namespace``/``claim``)."""

    def __init__(
        self,
        read: Callable[..., dict[str, Any] | None],
        claim: str | None,
        namespace: str | None,
        ttl: float = 30.0,
    ) -> None:
        self.read = read  # Kube.read_core
        self.claim = claim
        self.namespace = namespace
        self.ttl = ttl
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}
        self._loading: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def _cached(self, key: tuple[str, str], load: Callable[[], Any]) -> Any:
        with self._guard:
            hit = self._cache.get(key)
            loading = self._loading.setdefault(key, threading.Lock())
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        with loading:  # one lookup when the entry expires, however many models ask at once
            with self._guard:
                hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            value = load()
            with self._guard:
                self._cache[key] = (time.monotonic(), value)
        return value

    def forget(self, namespace: str, claim: str) -> None:
        with self._guard:
            self._cache.pop((namespace, claim), None)

    def bound(self, namespace: str, claim: str) -> tuple[str, dict[str, Any]] | str:
        """(PV name, PV) the claim is bound to, or why it is not usable."""

        def load() -> tuple[str, dict[str, Any]] | str:
            pvc = self.read("PersistentVolumeClaim", claim, namespace)
            if pvc is None:
                return f"PersistentVolumeClaim '{claim}' does not exist in namespace '{namespace}'"
            phase = (pvc.get("status") or {}).get("phase")
            pv_name = (pvc.get("spec") or {}).get("volumeName")
            if phase != "Bound" or not pv_name:
                return f"PersistentVolumeClaim '{namespace}/{claim}' is {phase or 'not bound'}, not Bound to a volume"
            pv = self.read("PersistentVolume", pv_name)
            if pv is None:
                return f"PersistentVolumeClaim '{namespace}/{claim}' is bound to '{pv_name}', which does not exist"
            return pv_name, pv

        return self._cached((namespace, claim), load)  # type: ignore[no-any-return]

    def own_volume(self) -> tuple[str, dict[str, Any]]:
        """The PersistentVolume the operator's own claim is bound to; ArtifactError if there is none."""
        if not (self.claim and self.namespace):
            raise ArtifactError(
                "ClaimRequired",
                "the operator was started without --claim-name/--claim-namespace, so it cannot provide or check "
                "claims: name a claim that reaches only this namespace's folder in spec.repository.claimName",
            )
        own = self.bound(self.namespace, self.claim)
        if isinstance(own, str):
            raise ArtifactError("OperatorClaimUnusable", f"the operator's repository claim is unusable: {own}")
        return own

    def check(self, namespace: str, server: str, claim: str) -> None:
        """Raise ArtifactError unless ``claim`` (in ``namespace``) reaches exactly ``<root>/<namespace>/``."""
        if not (self.claim and self.namespace):
            return  # the operator was not told its claim: nothing to compare with (development set-ups)
        own_name, own = self.own_volume()
        theirs = self.bound(namespace, claim)
        if isinstance(theirs, str):
            raise ArtifactError("ClaimNotBound", f"InferenceServer '{server}': {theirs}")
        their_name, their_pv = theirs
        if their_name == own_name or volume_identity(their_pv) == volume_identity(own):
            raise ArtifactError(
                "ClaimTooBroad",
                f"InferenceServer '{server}' uses PVC '{namespace}/{claim}', which reaches the whole repository "
                f"volume ({describe(volume_identity(own))}: every namespace's models); leave "
                "spec.repository.claimName out (the operator then provides a claim that reaches only "
                f"'{namespace}/') or bind the claim to that folder only",
            )
        if reaches_namespace(own, their_pv, namespace):
            return
        expected = namespace_source(own, namespace)
        where = (
            describe(volume_identity({"spec": expected}))
            if expected is not None
            else f"a PersistentVolume annotated {NAMESPACE_ANNOTATION}={namespace}"
        )
        raise ArtifactError(
            "ClaimNotMounted",
            f"InferenceServer '{server}' uses PVC '{namespace}/{claim}', bound to volume '{their_name}' "
            f"({describe(volume_identity(their_pv))}), but this namespace's models are in {where}; leave "
            "spec.repository.claimName out to let the operator provide the claim, or bind the claim there",
        )
