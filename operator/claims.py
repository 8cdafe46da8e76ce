"""Is an InferenceServer's repository claim the storage the operator writes to?

The operator renders models onto the volume mounted at ``--repository-root`` (its own PVC); a
server pod mounts ``spec.repository.claimName`` in *its* namespace. Equal claim names prove
nothing (a claim of the same name in another namespace may hold other storage, and a claim of
another name may hold the same), so the check compares what the claims are bound to: the same
PersistentVolume, or PersistentVolumes naming the same storage (CSI driver + volume handle, NFS
server + path, host/local path, or an identical source of any other type). A server whose claim is
missing, unbound or bound elsewhere is refused with a condition that says which.

Lookups are cached for ``ttl`` seconds: a resync of many models on one server costs no API call.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .artifacts import ArtifactError

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


def volume_identity(pv: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a PersistentVolume's data lives, comparable across PersistentVolume objects."""
    spec = pv.get("spec") or {}
    if csi := spec.get("csi"):
        return ("csi", str(csi.get("driver")), str(csi.get("volumeHandle")))
    if nfs := spec.get("nfs"):
        return ("nfs", str(nfs.get("server")), posixpath.normpath(str(nfs.get("path"))))
    if local := spec.get("local"):
        return (
            "local",
            posixpath.normpath(str(local.get("path"))),
            json.dumps(spec.get("nodeAffinity"), sort_keys=True),
        )
    if host := spec.get("hostPath"):
        return ("hostPath", posixpath.normpath(str(host.get("path"))))
    sources = {k: v for k, v in spec.items() if k not in _NOT_SOURCE}
    if sources:
        kind = sorted(sources)[0]
        return (kind, json.dumps(sources[kind], sort_keys=True))
    return ("pv", str((pv.get("metadata") or {}).get("name")))


def describe(identity: tuple[str, ...]) -> str:
    kind, *rest = identity
    if kind == "nfs":
        return f"NFS {rest[0]}:{rest[1]}"
    if kind == "csi":
        return f"CSI {rest[0]} volume {rest[1]}"
    if kind in ("local", "hostPath"):
        return f"{kind} {rest[0]}"
    return kind


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
        self._guard = threading.Lock()

    def _cached(self, key: tuple[str, str], load: Callable[[], Any]) -> Any:
        with self._guard:
            hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        value = load()
        with self._guard:
            self._cache[key] = (time.monotonic(), value)
        return value

    def _bound(self, namespace: str, claim: str) -> tuple[str, tuple[str, ...]] | str:
        """(PV name, storage identity) the claim is bound to, or why it is not usable."""

        def load() -> tuple[str, tuple[str, ...]] | str:
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
            return pv_name, volume_identity(pv)

        return self._cached((namespace, claim), load)  # type: ignore[no-any-return]

    def check(self, namespace: str, server: str, claim: str | None) -> None:
        """Raise ArtifactError unless ``claim`` (in ``namespace``) holds the operator's storage."""
        if not self.claim:
            return  # the operator was not told its claim: nothing to compare with
        if not claim:
            raise ArtifactError("ClaimNotMounted", f"InferenceServer '{server}' names no spec.repository.claimName")
        if not self.namespace:
            # out of cluster without --claim-namespace: only the name can be compared
            if claim != self.claim:
                raise ArtifactError(
                    "ClaimNotMounted",
                    f"InferenceServer '{server}' uses PVC '{claim}', but the operator writes to PVC "
                    f"'{self.claim}'; use that claim in spec.repository.claimName",
                )
            return
        own = self._bound(self.namespace, self.claim)
        if isinstance(own, str):
            raise ArtifactError("OperatorClaimUnusable", f"the operator's repository claim is unusable: {own}")
        theirs = self._bound(namespace, claim)
        if isinstance(theirs, str):
            raise ArtifactError("ClaimNotBound", f"InferenceServer '{server}': {theirs}")
        if theirs[0] != own[0] and theirs[1] != own[1]:
            raise ArtifactError(
                "ClaimNotMounted",
                f"InferenceServer '{server}' uses PVC '{namespace}/{claim}', bound to volume '{theirs[0]}' "
                f"({describe(theirs[1])}), but the operator writes to volume '{own[0]}' ({describe(own[1])}) "
                f"through PVC '{self.namespace}/{self.claim}'; bind the server's claim to the same storage",
            )
