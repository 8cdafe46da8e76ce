"""A repository claim per namespace, provided by the operator: it reaches only ``<root>/<namespace>/``.

For an InferenceServer that names no ``spec.repository.claimName``, the operator makes (once per
namespace) a PersistentVolume from its own volume's source with the namespace's folder appended
(``claims.namespace_source``: read-only where the source can say so, ``Retain`` so deleting it never
deletes models), pre-bound to a PersistentVolumeClaim it makes in the namespace. No tenant namespace
ever holds a claim on the whole volume; server pods mount this claim read-only.

A PersistentVolume left ``Released`` (its namespace was deleted and made again) is replaced: its data
stays, only the object is made anew. Results are cached for ``ttl`` seconds per namespace, so a resync
costs no API call.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..sources.artifacts import ArtifactError
from .claims import NAMESPACE_ANNOTATION, SUPPORTED_SOURCES, ClaimCheck, describe, namespace_source, volume_identity

#: the claim's name in every namespace (the operator's --tenant-claim-name)
DEFAULT_CLAIM = "kubeinfer-repository"
MANAGED_BY = {"app.kubernetes.io/managed-by": "kubeinfer-operator"}
NAMESPACE_LABEL = "serving.kubeinfer.io/tenant-namespace"


def volume_name(own_pv: str, namespace: str) -> str:
    """Cluster-unique and stable: one per (operator volume, namespace)."""
    return f"kubeinfer-{namespace}-{hashlib.sha256(own_pv.encode()).hexdigest()[:8]}"


def persistent_volume(
    name: str, own: Mapping[str, Any], source: Mapping[str, Any], namespace: str, claim: str
) -> dict[str, Any]:
    spec = own.get("spec") or {}
    body: dict[str, Any] = {
        **source,
        "capacity": spec.get("capacity") or {"storage": "1Gi"},
        "accessModes": ["ReadOnlyMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "volumeMode": "Filesystem",
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim},
    }
    if spec.get("mountOptions"):
        body["mountOptions"] = spec["mountOptions"]
    if spec.get("nodeAffinity"):  # where the storage is reachable (a hostPath or local volume's node)
        body.setdefault("nodeAffinity", spec["nodeAffinity"])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "labels": {**MANAGED_BY, NAMESPACE_LABEL: namespace},
            "annotations": {NAMESPACE_ANNOTATION: namespace},
        },
        "spec": body,
    }


def persistent_volume_claim(claim: str, namespace: str, volume: str, capacity: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": str(capacity.get("storage") or "1Gi")}},
        },
    }


class TenantVolumes:
    """Makes and keeps each namespace's claim (``kube``: ``read_core``, ``create_core``, ``delete_core``)."""

    def __init__(self, kube: Any, claims: ClaimCheck, claim: str = DEFAULT_CLAIM, ttl: float = 60.0) -> None:
        self.kube = kube
        self.claims = claims
        self.claim = claim
        self.ttl = ttl
        self._ready: dict[str, float] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def provide(self, namespace: str) -> str:
        """The claim server pods in ``namespace`` mount (made when missing); ArtifactError says why not."""
        with self._guard:
            if time.monotonic() - self._ready.get(namespace, -1e9) < self.ttl:
                return self.claim
            loading = self._loading.setdefault(namespace, threading.Lock())
        with loading:  # one check when the entry expires, however many models ask at once
            with self._guard:
                if time.monotonic() - self._ready.get(namespace, -1e9) < self.ttl:
                    return self.claim
            return self._provide(namespace)

    def _provide(self, namespace: str) -> str:
        own_name, own = self.claims.own_volume()
        source = namespace_source(own, namespace)
        if source is None:
            raise ArtifactError(
                "ClaimUnsupported",
                f"the operator cannot provide a claim for namespace '{namespace}': its repository volume "
                f"({describe(volume_identity(own))}) is not one it can divide ({SUPPORTED_SOURCES}); have an "
                f"admin create a PersistentVolume that reaches only '{namespace}/' of it, annotated "
                f"{NAMESPACE_ANNOTATION}={namespace}, bind a claim to it and name the claim in "
                "spec.repository.claimName",
            )
        name = volume_name(own_name, namespace)
        self._volume(name, persistent_volume(name, own, source, namespace, self.claim))
        self._claim(namespace, name, (own.get("spec") or {}).get("capacity") or {})
        with self._guard:
            self._ready[namespace] = time.monotonic()
        return self.claim

    def _volume(self, name: str, desired: dict[str, Any]) -> None:
        current = self.kube.read_core("PersistentVolume", name)
        if current is not None:
            labels = (current.get("metadata") or {}).get("labels") or {}
            if labels.get(NAMESPACE_LABEL) != desired["metadata"]["labels"][NAMESPACE_LABEL]:
                raise ArtifactError(
                    "ClaimConflict",
                    f"PersistentVolume '{name}' exists and was not made by the operator for this namespace; delete it",
                )
            if volume_identity(current) != volume_identity(desired) or (current.get("status") or {}).get("phase") in (
                "Released",
                "Failed",
            ):
                # its claim is gone (the namespace was deleted and made again) or the operator's volume moved:
                # only the object is replaced (Retain: the folder and its models stay)
                self.kube.delete_core("PersistentVolume", name)
                deadline = time.monotonic() + 30
                while self.kube.read_core("PersistentVolume", name) is not None:
                    if time.monotonic() > deadline:
                        raise ArtifactError("ClaimPending", f"PersistentVolume '{name}' is still being deleted")
                    time.sleep(0.5)
                current = None
        if current is None:
            self.kube.create_core(desired)

    def _claim(self, namespace: str, volume: str, capacity: Mapping[str, Any]) -> None:
        current = self.kube.read_core("PersistentVolumeClaim", self.claim, namespace)
        if current is None:
            self.kube.create_core(persistent_volume_claim(self.claim, namespace, volume, capacity))
            self.claims.forget(namespace, self.claim)
            return
        if (current.get("spec") or {}).get("volumeName") != volume:
            raise ArtifactError(
                "ClaimConflict",
                f"PersistentVolumeClaim '{namespace}/{self.claim}' exists but is not the operator's claim on this "
                f"namespace's folder (it names volume '{(current.get('spec') or {}).get('volumeName')}'); delete it, "
                "or name the claim you want in spec.repository.claimName",
            )
